// tessera serve: the command line of the image server (apps/cli/server.h).
#include "commands.h"
#include "server.h"

namespace tessera::cli {

void register_serve(CLI::App& app, Runner& run) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* sub = app.add_subcommand(
      "serve", "Serve one pipeline over HTTP (OpenAI images API, AUTOMATIC1111 txt2img)");
  sub->add_option("--model", o->model,
                  "diffusers pipeline folder (default: the bundled default model)");
  sub->add_option("--host", o->host, "address to listen on (default 127.0.0.1: this machine only)");
  sub->add_option("--port", o->port, "TCP port (default 7860; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--dtype", o->dtype, "f32 (default) or bf16 (as generate)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--mode", o->mode, "execution mode: eager, defer or compile (as generate)")
      ->check(CLI::IsMember({"eager", "defer", "compile"}));
  sub->add_option("--offload", o->offload, "none (default), model or sequential (as generate)")
      ->check(CLI::IsMember({"none", "model", "sequential"}));
  sub->add_option("--max-queue", o->max_queue,
                  "requests waiting behind the running one before 503 (default 8)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--api-key", o->api_key,
                  "require 'Authorization: Bearer KEY' (or X-API-Key) on every request but "
                  "/health and /");
  sub->callback([o, &run] { run = [o] { return serve(*o); }; });
}

}  // namespace tessera::cli
