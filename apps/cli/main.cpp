// tessera: the command-line front end. Parsing errors come from CLI11 (exit code 105-109, usage
// on stderr); failures while running a subcommand print one "tessera: error: ..." line, exit 1.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "commands.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/primitive.h"

namespace {

int fail(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';  // keep the error on one line
  // A rank of tessera launch says which one it is (every rank may print the same error).
  const char* rank = tessera::env::raw("OMPI_COMM_WORLD_RANK");
  const char* size = tessera::env::raw("OMPI_COMM_WORLD_SIZE");
  const std::string who = rank && size && std::atoi(size) > 1 ? std::string("[rank ") + rank + "] " : "";
  std::fprintf(stderr, "tessera: error: %s%s\n", who.c_str(), message.c_str());
  return 1;
}

// OpenMP threads that spin at barriers starve a worker the OS has descheduled: on a 2-core
// machine with one other busy process, the bundled model took 17-20 s with libgomp's default
// (spinning) wait instead of 0.3 s. libgomp reads its wait policy once, when it is loaded, so
// the CLI re-executes itself with a passive wait unless the user chose a policy or one thread
// (decision 0006). If the re-exec fails, it runs on with the default.
void prefer_passive_openmp_wait(char** argv) {
  if (tessera::env::raw("OMP_WAIT_POLICY") || tessera::env::raw("GOMP_SPINCOUNT")) return;
  try {
    if (tessera::env::integer(tessera::EnvVar::num_threads) == 1) return;
  } catch (const tessera::Error&) {
    // A malformed value is reported by env::validate() below, once errors can be printed.
  }
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
}

// Ops still queued by async dispatch run before main returns, never while statics are destroyed;
// their errors no longer matter (the command has succeeded or failed already).
void finish_queued_work() {
  try {
    tessera::synchronize_all_devices();
  } catch (...) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_openmp_wait(argv);
  CLI::App app{"tessera: diffusers text-to-image pipelines in C++", "tessera"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  app.require_subcommand(0, 1);
  tessera::cli::Runner run;
  tessera::cli::register_generate(app, run);
  tessera::cli::register_inspect(app, run);
  tessera::cli::register_run(app, run);
  tessera::cli::register_serve(app, run);
  tessera::cli::register_compile(app, run);
  tessera::cli::register_launch(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  int code;
  try {
    tessera::env::validate();  // a malformed TESSERA_* value fails here, before any work
    code = run();
  } catch (const tessera::Error& e) {
    code = fail(e.what());
  } catch (const std::bad_alloc&) {
    code = fail("out of memory");
  } catch (const std::exception& e) {
    code = fail(e.what());
  }
  finish_queued_work();
  return code;
}
