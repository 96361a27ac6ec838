// Subcommands of the tessera CLI. Each lives in apps/cli/<name>.cpp and registers itself on the
// app; its callback stores the work to run in `run`, which main() calls after parsing succeeds.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace tessera::cli {

using Runner = std::function<int()>;  // returns the process exit code

void register_inspect(CLI::App& app, Runner& run);
void register_generate(CLI::App& app, Runner& run);
void register_run(CLI::App& app, Runner& run);
void register_serve(CLI::App& app, Runner& run);
void register_compile(CLI::App& app, Runner& run);
void register_launch(CLI::App& app, Runner& run);

}  // namespace tessera::cli
