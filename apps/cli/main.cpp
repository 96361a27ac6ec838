// tessera: the command-line front end. Parsing errors come from CLI11 (exit code 105-109, usage
// on stderr); failures while running a subcommand print one "tessera: error: ..." line, exit 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <string>

#include "commands.h"
#include "runtime/error.h"

namespace {

int fail(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';  // keep the error on one line
  std::fprintf(stderr, "tessera: error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera: diffusers text-to-image pipelines in C++", "tessera"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  app.require_subcommand(0, 1);
  tessera::cli::Runner run;
  tessera::cli::register_generate(app, run);
  tessera::cli::register_inspect(app, run);
  tessera::cli::register_run(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  try {
    return run();
  } catch (const tessera::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
