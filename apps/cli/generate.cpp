// tessera generate: text to image with a diffusers pipeline folder, diffusers' defaults per model.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/model_folder.h"
#include "io/png.h"
#include "pipelines/registry.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/modes.h"

namespace tessera::cli {
namespace {

struct GenerateOptions {
  std::string model, prompt, prompt_2, output = "tessera.png", report, dtype = "f32",
                                       device = "cpu", mode, offload = "none";
  bool compile = false, compile_regional = false;
  std::optional<int64_t> height, width;
  std::optional<int> steps;
  std::optional<double> guidance;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_sequence_length;
  int num_images = 1;
};

// The bundled default model: the trained shapes model once it exists, else the tiny test
// pipeline (random weights: it makes noise, but runs the whole FLUX.1 path).
std::string default_model(bool* is_test_pipeline) {
  const std::string root = TESSERA_SOURCE_DIR;
  const std::string trained = root + "/models/tessera-shapes";
  *is_test_pipeline = !std::filesystem::exists(trained + "/model_index.json");
  return *is_test_pipeline ? root + "/tests/fixtures/flux1-schnell-tiny" : trained;
}

// The bundled model is trained at one size and T5 length: its vae sample_size and tokenizer_2
// model_max_length are its defaults (diffusers' FLUX defaults, 1024 px and 512 tokens, are not).
struct BundledDefaults {
  std::optional<int64_t> size, max_sequence_length;
};
BundledDefaults bundled_defaults(const std::string& model) {
  const auto read = [](const std::string& path) {
    std::ifstream f(path);
    return f ? nlohmann::json::parse(f, nullptr, false) : nlohmann::json();
  };
  const auto int_field = [](const nlohmann::json& j, const char* key) -> std::optional<int64_t> {
    if (j.is_object() && j.contains(key) && j[key].is_number_integer())
      return j[key].get<int64_t>();
    return std::nullopt;
  };
  return {int_field(read(model + "/vae/config.json"), "sample_size"),
          int_field(read(model + "/tokenizer_2/tokenizer_config.json"), "model_max_length")};
}

std::string output_name(const std::string& output, int index, int count) {
  if (count == 1) return output;
  const std::filesystem::path p(output);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + p.extension().string()))
      .string();
}

// A progress bar with step rate and ETA on a terminal; plain lines otherwise.
void show_progress(int step, int total, double elapsed) {
  const double rate = elapsed > 0 ? step / elapsed : 0;
  const double eta = rate > 0 ? (total - step) / rate : 0;
  if (isatty(fileno(stderr))) {
    const int width = 30, filled = total ? width * step / total : width;
    std::fprintf(stderr, "\r[%.*s%*s] %d/%d steps  %.2f it/s  ETA %.1fs", filled,
                 "##############################", width - filled, "", step, total, rate, eta);
    if (step == total) std::fputc('\n', stderr);
  } else {
    std::fprintf(stderr, "step %d/%d  %.2f it/s  ETA %.1fs\n", step, total, rate, eta);
  }
}

// The whole run's peaks (the max over stages) and reads (their sum), then each stage.
nlohmann::json memory_json(const StageMemory& load, const StageMemories& m) {
  StageMemory total = load;
  for (const StageMemory* s : {&m.encode, &m.denoise, &m.decode}) total.merge(*s);
  nlohmann::json j = nlohmann::json::parse(total.json());
  j["stages"] = {{"load", nlohmann::json::parse(load.json())},
                 {"encode", nlohmann::json::parse(m.encode.json())},
                 {"denoise", nlohmann::json::parse(m.denoise.json())},
                 {"decode", nlohmann::json::parse(m.decode.json())}};
  return j;
}

int run_generate(const GenerateOptions& o) {
  bool test_pipeline = false;
  const std::string model = o.model.empty() ? default_model(&test_pipeline) : o.model;
  // Check the output location before any work, so a bad path fails fast.
  const std::filesystem::path out_dir =
      std::filesystem::absolute(o.output).parent_path();
  TESSERA_CHECK(std::filesystem::is_directory(out_dir), "cannot write '", o.output,
                "': folder ", out_dir.string(), " does not exist");
  TESSERA_CHECK(access(out_dir.c_str(), W_OK) == 0, "cannot write '", o.output, "': folder ",
                out_dir.string(), " is not writable");
  TESSERA_CHECK(o.num_images >= 1, "--num-images must be >= 1");
  if (o.model.empty())
    std::fprintf(stderr, "tessera: using the bundled default model %s%s\n", model.c_str(),
                 test_pipeline ? " (tiny random-weight test pipeline: the image is noise)" : "");

  // --mode overrides TESSERA_DEFER_AND_FUSE; compiled modes apply to the transformer only.
  const bool compile_full = (o.compile || o.mode == "compile") && !o.compile_regional;
  TESSERA_CHECK(!compile_full || o.offload == "none",
                "--compile compiles the whole transformer with its weights as constants, which "
                "offload could not release; use --compile-regional with --offload");
  if (o.mode == "eager") set_eager_mode(EagerMode::DeferNever);
  if (o.mode == "defer") set_eager_mode(EagerMode::DeferAndFuse);
  reset_mode_stats();
  PipelineLoadOptions load;
  load.dtype = dtype_from_name(o.dtype);
  load.device = Device::parse(o.device);
  load.offload = offload_mode_from_name(o.offload);
  if (load.offload != OffloadMode::none) load.offload_device = load.device;
  cpu_allocator().reset_peak();
  const double t_load = now_seconds();
  // The class model_index.json names (pipelines/registry.h); compile applies to its denoiser.
  auto pipe = DiffusionPipeline::from_pretrained(model, load);
  if (compile_full || o.compile_regional) pipe->denoiser().reset_compile();
  if (compile_full) pipe->denoiser().compile();
  if (o.compile_regional) pipe->denoiser().compile_repeated_blocks();
  const double load_seconds = now_seconds() - t_load;

  TextToImageOptions call;
  call.prompt = {o.prompt};
  if (!o.prompt_2.empty()) call.prompt_2 = std::vector<std::string>{o.prompt_2};
  call.height = o.height;
  call.width = o.width;
  const BundledDefaults bundled =
      o.model.empty() && !test_pipeline ? bundled_defaults(model) : BundledDefaults{};
  if (!call.height) call.height = bundled.size;
  if (!call.width) call.width = bundled.size;
  call.num_inference_steps = o.steps;
  call.guidance_scale = o.guidance;
  call.num_images_per_prompt = o.num_images;
  call.seed = o.seed;
  const PipelineDefaults d = pipe->pipeline_defaults();
  call.max_sequence_length =
      o.max_sequence_length.value_or(bundled.max_sequence_length.value_or(d.max_sequence_length));
  const double t_steps = now_seconds();
  call.on_step_end = [&](int i, int n, const Tensor&) {
    show_progress(i + 1, n, now_seconds() - t_steps);
  };
  const PipelineOutput out = pipe->generate(call);

  const int steps = o.steps.value_or(d.num_inference_steps);
  const double guidance = o.guidance.value_or(d.guidance_scale);
  GenerationInfo info{o.prompt, out.seed, steps, guidance,
                      int(out.images[0].width), int(out.images[0].height), model};
  for (size_t i = 0; i < out.images.size(); ++i) {
    const std::string path = output_name(o.output, int(i), int(out.images.size()));
    write_png(path, out.images[i].pixels.data(), int(out.images[i].width),
              int(out.images[i].height), generation_text(info));
    std::fprintf(stderr, "tessera: wrote %s (%lldx%lld, seed %llu)\n", path.c_str(),
                 (long long)out.images[i].width, (long long)out.images[i].height,
                 (unsigned long long)out.seed);
  }

  if (!o.report.empty()) {
    double step_total = 0;
    for (double s : out.times.step_seconds) step_total += s;
    nlohmann::json r = {
        {"model", model},
        {"pipeline", pipe->class_name()},
        {"prompt", o.prompt},
        {"seed", out.seed},
        {"height", info.height},
        {"width", info.width},
        {"steps", steps},
        {"guidance", guidance},
        {"num_images", o.num_images},
        {"dtype", o.dtype},
        {"device", load.device.str()},
        {"times",
         {{"load", load_seconds},
          {"encode", out.times.encode_seconds},
          {"steps", out.times.step_seconds},
          {"denoise", step_total},
          {"decode", out.times.decode_seconds},
          {"total", load_seconds + out.times.encode_seconds + step_total +
                        out.times.decode_seconds}}},
        {"offload", o.offload},
        {"memory", memory_json(pipe->load_memory(), out.memory)},
        {"modes", nlohmann::json::parse(mode_stats_json(mode_stats()))},
    };
    std::ofstream f(o.report);
    TESSERA_CHECK(f && (f << r.dump(2) << "\n"), "cannot write report '", o.report, "'");
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Runner& run) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Generate an image from a prompt");
  sub->add_option("--model", o->model,
                  "diffusers pipeline folder (default: the bundled default model)");
  sub->add_option("--prompt", o->prompt, "the prompt")->required();
  sub->add_option("--prompt-2", o->prompt_2, "prompt for the T5 encoder (default: --prompt)");
  sub->add_option("--height", o->height, "image height, a multiple of 16 (default 1024)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--width", o->width, "image width, a multiple of 16 (default 1024)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--steps", o->steps,
                  "inference steps (default: 4 for schnell-style models, 28 for dev)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--guidance", o->guidance, "guidance scale (default: 0 schnell, 3.5 dev)");
  sub->add_option("--seed", o->seed, "seed of torch.Generator(\"cpu\").manual_seed (default: random)");
  sub->add_option("--num-images", o->num_images, "images per prompt")->check(CLI::PositiveNumber);
  sub->add_option("--max-sequence-length", o->max_sequence_length,
                  "T5 tokens (default: 256 schnell, 512 dev; at most 512)")
      ->check(CLI::Range(1, 512));
  sub->add_option("--dtype", o->dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--device", o->device, "execution device (cpu)");
  sub->add_option("--mode", o->mode,
                  "execution mode: eager (strict, default), defer (deferred and fused) or "
                  "compile (the transformer traced once per input shape into one program)")
      ->check(CLI::IsMember({"eager", "defer", "compile"}));
  sub->add_flag("--compile", o->compile, "same as --mode compile");
  sub->add_flag("--compile-regional", o->compile_regional,
                "compile each repeated transformer block class once (weights as inputs; works "
                "with --offload); the rest runs in the eager/defer mode chosen");
  sub->add_option("--offload", o->offload,
                  "none (default), model (each model's weights only while it runs) or "
                  "sequential (the transformer's blocks one at a time)")
      ->check(CLI::IsMember({"none", "model", "sequential"}));
  sub->add_option("--output,-o", o->output, "output PNG (with --num-images N: name-0.png ...)");
  sub->add_option("--report", o->report, "write a JSON report: times per stage, peak memory");
  sub->callback([o, &run] { run = [o] { return run_generate(*o); }; });
}

}  // namespace tessera::cli
