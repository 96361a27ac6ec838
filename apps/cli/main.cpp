// tessera: the command-line front end.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "runtime/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: diffusers text-to-image pipelines in C++"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (argc == 1) std::fputs(app.help().c_str(), stdout);
  return 0;
}
