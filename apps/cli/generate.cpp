// tessera generate: text to image with a diffusers pipeline folder; every default is the
// default of the diffusers call for that pipeline (the bundled model's size and T5 length aside).
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "model_defaults.h"
#include "io/model_folder.h"
#include "io/png.h"
#include "pipelines/registry.h"
#include "runtime/allocator.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#ifdef TESSERA_HAS_XLA
#include "backends/xla/xla_backend.h"
#endif

namespace tessera::cli {
namespace {

struct GenerateOptions {
  std::string model, prompt, prompt_2, prompt_3, negative_prompt, output = "tessera.png", report, dtype = "f32",
                                       device = "cpu", mode, offload = "none";
  bool compile = false, compile_regional = false;
  std::optional<int64_t> height, width;
  std::optional<int> steps;
  std::optional<double> guidance;
  std::optional<std::string> seed;  // parsed by ManualSeed: CLI11 would clamp out-of-range values
  std::optional<int64_t> max_sequence_length;
  std::vector<int64_t> text_encoder_out_layers;  // empty: the pipeline's default
  int num_images = 1;
  int tp = 1;  // tensor-parallel degree: the ranks tessera launch started
};

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

// Each component's checkpoint bytes read at load, by name.
nlohmann::json load_components_json(const std::vector<DiffusionPipeline::ComponentLoad>& loads) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : loads) j[c.name] = {{"checkpoint_read_bytes", c.checkpoint_read_bytes}};
  return j;
}

void check_writable_folder(const std::string& file) {
  const std::filesystem::path dir = std::filesystem::absolute(file).parent_path();
  TESSERA_CHECK(std::filesystem::is_directory(dir), "cannot write '", file, "': folder ",
                dir.string(), " does not exist");
  TESSERA_CHECK(access(dir.c_str(), W_OK) == 0, "cannot write '", file, "': folder ",
                dir.string(), " is not writable");
}

int run_generate(const GenerateOptions& o) {
  bool test_pipeline = false;
  const std::string model = o.model.empty() ? default_model(&test_pipeline) : o.model;
  // Everything that could fail after the denoising is checked before any work.
  std::optional<ManualSeed> seed;
  if (o.seed) {
    seed = ManualSeed::parse(*o.seed);
    TESSERA_CHECK(seed, "[generate] --seed ", *o.seed, ": expected an integer in ",
                  ManualSeed::kRange, " (what torch.Generator.manual_seed accepts)");
  }
  check_writable_folder(o.output);
  if (!o.report.empty()) check_writable_folder(o.report);
  TESSERA_CHECK(o.num_images >= 1, "--num-images must be >= 1");
  GenerationInfo info{o.prompt, o.prompt_2, "0", 0, 0.0, 0, 0, model};
  try {
    check_png_text(generation_text(info));
  } catch (const Error& e) {
    TESSERA_FAIL("[generate] the image's text chunks cannot hold the prompt or model: ",
                 e.what());
  }
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
  // Tensor parallelism: one process per rank (tessera launch); every rank runs the whole call on
  // the same inputs and noise, the transformer split by its plan; rank 0 writes the outputs.
  std::shared_ptr<ProcessGroup> world;
  if (o.tp == 1 && launched_by_mpirun())
    TESSERA_FAIL("[generate] started on several ranks (tessera launch) but --tp is 1; pass --tp "
                 "with the number of ranks");
  // On an XLA device, --tp N is one process driving N of its devices (SPMD, decision 0060).
  const Device tp_device = Device::parse(o.device);
  const bool spmd = o.tp > 1 && (tp_device.type == DeviceType::xla ||
                                 tp_device.type == DeviceType::tpu);
  if (spmd) {
    TESSERA_CHECK(!launched_by_mpirun(), "[generate] --tp ", o.tp, " on ", tp_device.str(),
                  " is one process driving ", o.tp, " devices; start it without tessera launch");
    TESSERA_CHECK(compile_full || o.compile_regional || o.mode == "defer", "[generate] --tp ",
                  o.tp, " on ", tp_device.str(), " runs the transformer as SPMD programs: use "
                  "--mode compile, --compile-regional or --mode defer (strict eager runs op by op "
                  "and has no program to split)");
    load.tensor_parallel = TensorParallelConfig::over_devices(tp_device, o.tp, "[generate]");
  } else if (o.tp > 1) {
    TESSERA_CHECK(launched_by_mpirun(), "[generate] --tp ", o.tp, " needs ", o.tp,
                  " processes: start it with tessera launch --nproc-per-node ", o.tp,
                  " -- generate ... --tp ", o.tp);
    load.tensor_parallel = TensorParallelConfig::over_world(o.tp, "[generate]");
    world = load.tensor_parallel->group;
    if (!seed) {  // one random seed for every rank: rank 0's
      uint64_t bits = std::random_device{}() * 0x100000000ull + std::random_device{}();
      world->broadcast(&bits, sizeof bits, 0);
      seed = ManualSeed::parse(std::to_string(bits));
    }
  }
  const bool writer = !world || world->rank() == 0;
  load.dtype = dtype_from_name(o.dtype);
  load.device = Device::parse(o.device);
  load.offload = offload_mode_from_name(o.offload);
  if (load.offload != OffloadMode::none) load.offload_device = load.device;
  cpu_allocator().reset_peak();
  const double t_load = now_seconds();
  // The class model_index.json names (pipelines/registry.h); compile applies to its denoiser.
  auto pipe = DiffusionPipeline::from_pretrained(model, load);
  if (world || spmd) {
    bool sharded = false;
    for (const auto& p : pipe->denoiser().named_parameters())
      sharded |= p.shard.sharded() || p.split.sharded();
    TESSERA_CHECK(sharded, "[generate] --tp ", o.tp, ": ", pipe->class_name(),
                  "'s denoiser has no tensor-parallel plan (the FLUX.1, FLUX.2 and SD3 "
                  "transformers have one)");
  }
  if (compile_full || o.compile_regional) pipe->denoiser().reset_compile();
  CompileOptions copt;  // programs for the execution device's backend (cpu, xla)
  copt.backend = backend_for(load.device).name();
  if (compile_full) pipe->denoiser().compile(copt);
  if (o.compile_regional) pipe->denoiser().compile_repeated_blocks(copt);
  const double load_seconds = now_seconds() - t_load;

  TextToImageOptions call;
  call.prompt = {o.prompt};
  if (!o.prompt_2.empty()) call.prompt_2 = std::vector<std::string>{o.prompt_2};
  if (!o.prompt_3.empty()) call.prompt_3 = std::vector<std::string>{o.prompt_3};
  if (!o.negative_prompt.empty())
    call.negative_prompt = std::vector<std::string>{o.negative_prompt};
  call.height = o.height;
  call.width = o.width;
  const BundledDefaults bundled =
      o.model.empty() && !test_pipeline ? bundled_defaults(model) : BundledDefaults{};
  if (!call.height) call.height = bundled.size;
  if (!call.width) call.width = bundled.size;
  call.num_inference_steps = o.steps;
  call.guidance_scale = o.guidance;
  call.num_images_per_prompt = o.num_images;
  if (seed) call.seed = seed->bits;
  const PipelineDefaults d = pipe->pipeline_defaults();
  call.max_sequence_length =
      o.max_sequence_length.value_or(bundled.max_sequence_length.value_or(d.max_sequence_length));
  if (!o.text_encoder_out_layers.empty()) call.text_encoder_out_layers = o.text_encoder_out_layers;
  const double t_steps = now_seconds();
  call.on_step_end = [&](int i, int n, const Tensor&) {
    if (writer) show_progress(i + 1, n, now_seconds() - t_steps);
  };
  const PipelineOutput out = pipe->generate(call);

  const int steps = o.steps.value_or(d.num_inference_steps);
  const double guidance = o.guidance.value_or(d.guidance_scale);
  // The seed as given (torch maps -1 and 2^64 - 1 to the same generator; the user wrote one).
  info.seed = seed ? seed->str() : std::to_string(out.seed);
  info.steps = steps;
  info.guidance = guidance;
  info.width = int(out.images[0].width);
  info.height = int(out.images[0].height);
  const auto loads = pipe->component_loads();
  // Tensor parallelism: every rank's checkpoint bytes and weight peak, gathered for the report.
  nlohmann::json tp_json;
  if (world) {
    const StageMemory& lm = pipe->load_memory();
    const int64_t mine[2] = {lm.disk_read_bytes, lm.peak_weight_bytes};
    std::vector<int64_t> all(size_t(2 * world->size()));
    world->all_gather(mine, all.data(), sizeof mine);
    std::vector<int64_t> read, peak;
    for (int r = 0; r < world->size(); ++r) {
      read.push_back(all[size_t(2 * r)]);
      peak.push_back(all[size_t(2 * r + 1)]);
    }
    // Each component's bytes per rank (every rank loads the same components in the same order).
    std::vector<int64_t> own, every(loads.size() * size_t(world->size()));
    for (const auto& c : loads) own.push_back(c.checkpoint_read_bytes);
    world->all_gather(own.data(), every.data(), own.size() * sizeof(int64_t));
    nlohmann::json components = nlohmann::json::object();
    for (size_t i = 0; i < loads.size(); ++i) {
      std::vector<int64_t> per_rank;
      for (int r = 0; r < world->size(); ++r)
        per_rank.push_back(every[size_t(r) * loads.size() + i]);
      components[loads[i].name] = {{"sharded", loads[i].sharded},
                                   {"checkpoint_read_bytes", per_rank}};
    }
    tp_json = {{"degree", world->size()},
               {"backend", world->backend()},
               {"checkpoint_read_bytes", read},
               {"peak_weight_bytes", peak},
               {"components", components},
               {"collectives", world->collectives()}};
  } else if (spmd) {
    tp_json = {{"degree", o.tp}, {"backend", "spmd"}, {"devices", load.tensor_parallel->mesh.str()}};
  }
  if (!writer) {
    destroy_process_group();
    return 0;
  }
  for (size_t i = 0; i < out.images.size(); ++i) {
    const std::string path = output_name(o.output, int(i), int(out.images.size()));
    write_png(path, out.images[i].pixels.data(), int(out.images[i].width),
              int(out.images[i].height), generation_text(info));
    std::fprintf(stderr, "tessera: wrote %s (%lldx%lld, seed %s)\n", path.c_str(),
                 (long long)out.images[i].width, (long long)out.images[i].height,
                 info.seed.c_str());
  }

  if (!o.report.empty()) {
    double step_total = 0;
    for (double s : out.times.step_seconds) step_total += s;
    nlohmann::json r = {
        {"model", model},
        {"pipeline", pipe->class_name()},
        {"prompt", o.prompt},
        {"prompt_2", o.prompt_2.empty() ? nlohmann::json() : nlohmann::json(o.prompt_2)},
        {"prompt_3", o.prompt_3.empty() ? nlohmann::json() : nlohmann::json(o.prompt_3)},
        {"negative_prompt",
         o.negative_prompt.empty() ? nlohmann::json() : nlohmann::json(o.negative_prompt)},
        {"seed", seed && seed->negative ? nlohmann::json(int64_t(seed->bits))
                                        : nlohmann::json(out.seed)},
        {"height", info.height},
        {"width", info.width},
        {"steps", steps},
        {"guidance", guidance},
        {"max_sequence_length", *call.max_sequence_length},
        {"text_encoder_out_layers", o.text_encoder_out_layers.empty()
                                        ? nlohmann::json()
                                        : nlohmann::json(o.text_encoder_out_layers)},
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
        {"load_components", load_components_json(loads)},
        {"modes", nlohmann::json::parse(mode_stats_json(mode_stats()))},
        {"tensor_parallel", tp_json},
    };
#ifdef TESSERA_HAS_XLA
    // What the XLA devices compiled and what they read from the executable cache (0045).
    const XlaStats x = xla_stats();
    r["xla"] = {{"executables_needed", x.compiles + x.graph_compiles},
                {"plugin_compiles", x.plugin_compiles},
                {"disk_hits", x.disk_hits},
                {"disk_writes", x.disk_writes},
                {"disk_rejected", x.disk_rejected},
                {"compile_seconds", x.compile_seconds}};
#endif
    std::ofstream f(o.report);
    TESSERA_CHECK(f && (f << r.dump(2) << "\n"), "cannot write report '", o.report, "'");
  }
  if (world) destroy_process_group();
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Runner& run) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Generate an image from a prompt");
  sub->add_option("--model", o->model,
                  "diffusers pipeline folder (default: the bundled default model)");
  sub->add_option("--prompt", o->prompt, "the prompt (may be empty)")->required();
  sub->add_option("--prompt-2", o->prompt_2,
                  "prompt for the second text encoder: T5 for FLUX.1, CLIP-G for SD3 (default, "
                  "or when empty: --prompt)");
  sub->add_option("--prompt-3", o->prompt_3,
                  "prompt for the third text encoder, T5 of SD3 (default, or when empty: "
                  "--prompt); FLUX.1 refuses it");
  sub->add_option("--negative-prompt", o->negative_prompt,
                  "negative prompt of classifier-free guidance (SD3; default empty); FLUX.1 "
                  "refuses it");
  sub->add_option("--height", o->height,
                  "image height, a multiple of 16 (default: 128 x the VAE's scale factor, 1024 "
                  "for FLUX.1; SD3: the transformer's sample_size x 8, 1024 for SD3.5; the "
                  "bundled model: 64)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--width", o->width,
                  "image width, a multiple of 16 (default: as --height)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--steps", o->steps,
                  "inference steps (default 28, as diffusers' FluxPipeline and "
                  "StableDiffusion3Pipeline)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--guidance", o->guidance,
                  "guidance scale (FLUX.1: default 3.5, used only by models with a guidance "
                  "embedding, FLUX.1-dev-style; SD3: default 7.0, classifier-free guidance "
                  "above 1)");
  sub->add_option("--seed", o->seed,
                  std::string("seed of torch.Generator(\"cpu\").manual_seed: an integer in ") +
                      ManualSeed::kRange + ", negative ones mapped as torch maps them, to seed + "
                      "2^64 (default: random)")
      ->type_name("INT");
  sub->add_option("--num-images", o->num_images, "images per prompt")->check(CLI::PositiveNumber);
  sub->add_option("--max-sequence-length", o->max_sequence_length,
                  "T5 tokens, 1 to 512 (default 512 for FLUX.1, 256 for SD3, as diffusers; the "
                  "bundled model: 48)")
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            long long n = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (ec == std::errc::result_out_of_range) n = v[0] == '-' ? 0 : 513;
            else if (ec != std::errc() || end != v.data() + v.size())
              return "expected an integer from 1 to 512, got " + v;
            // diffusers raises the same: T5 in FluxPipeline takes at most 512 tokens.
            if (n > 512) return "cannot be greater than 512, got " + v;
            if (n < 1) return "must be at least 1, got " + v;
            return "";
          },
          "", "MaxSequenceLength"));
  sub->add_option("--text-encoder-out-layers", o->text_encoder_out_layers,
                  "FLUX.2: the text encoder's hidden-state layers stacked into the prompt "
                  "embedding, as Flux2Pipeline's text_encoder_out_layers (default 10 20 30); "
                  "their count times the encoder's width must be the transformer's "
                  "joint_attention_dim")
      ->expected(1, -1)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--dtype", o->dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--device", o->device, "execution device: cpu, xla:cpu, xla:cuda, tpu");
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
                  "sequential (repeated blocks one at a time: the transformer's, and FLUX.2's "
                  "text-encoder layers)")
      ->check(CLI::IsMember({"none", "model", "sequential"}));
  sub->add_option("--output,-o", o->output, "output PNG (with --num-images N: name-0.png ...)");
  sub->add_option("--report", o->report, "write a JSON report: times per stage, peak memory");
  sub->add_option("--tp", o->tp,
                  "tensor-parallel degree: the transformer (FLUX.1, FLUX.2, SD3) split over N ranks started by "
                  "tessera launch --nproc-per-node N, or over N devices of an XLA --device (default 1)")
      ->check(CLI::PositiveNumber);
  sub->callback([o, &run] { run = [o] { return run_generate(*o); }; });
}

}  // namespace tessera::cli
