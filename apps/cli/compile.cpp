// tessera compile: a pipeline's denoiser programs compiled ahead of time for an XLA target (a TPU
// topology through libtpu, with or without a TPU; xla:cpu; xla:cuda), written to the executable
// cache folder, with each program's compile time and memory needs against the chip's memory
// (decision 0046). Only the configs are read: weights need not be there.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "pipelines/denoiser_aot.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/error.h"
#ifdef TESSERA_HAS_XLA
#include "backends/xla/xla_backend.h"
#endif

namespace tessera::cli {
namespace {

struct CompileCliOptions {
  std::string model, target, dtype = "bf16", cache_dir, report;
  int64_t height = 1024, width = 1024, max_sequence_length = 0, batch = 0;
  bool regional = false;
  int tp = 1;  // SPMD over this many chips (decision 0060)
};

// High-bandwidth memory per chip, by the topology's generation (Cloud TPU documentation).
int64_t hbm_bytes(const std::string& topology) {
  const std::string gen = topology.substr(0, topology.find_first_of(":=_"));
  constexpr int64_t GiB = int64_t(1) << 30;
  if (gen == "v6e") return 32 * GiB;
  if (gen == "v5e" || gen == "v5litepod") return 16 * GiB;
  if (gen == "v5p") return 95 * GiB;
  if (gen == "v4") return 32 * GiB;
  return 0;  // unknown: reported without a verdict
}

std::string gib(int64_t bytes) {
  char buf[32];
  const double b = double(bytes);
  if (bytes >= (int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  else if (bytes >= (int64_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(int64_t(1) << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

std::string default_cache_dir() {
  const std::string env = compile_cache_dir();
  if (!env.empty()) return env;
  const char* home = std::getenv("HOME");
  TESSERA_CHECK(home, "[compile] no --cache-dir, TESSERA_CACHE_DIR or HOME to put executables in");
  return std::string(home) + "/.cache/tessera/executables";
}

int run_compile(const CompileCliOptions& o) {
#ifndef TESSERA_HAS_XLA
  (void)o;
  TESSERA_FAIL("[compile] tessera was built without the XLA backend (scripts/setup_xla.sh "
               "installs the plugin it is built against)");
#else
  // --target: tpu:<topology> (compile-only through libtpu), xla:cpu or xla:cuda.
  std::string topology;
  Device device;
  if (o.target.rfind("tpu:", 0) == 0 && o.target.size() > 4) {
    topology = o.target.substr(4);
    device = Device::parse("tpu:0");
  } else if (o.target == "xla:cpu" || o.target == "xla:cuda") {
    device = Device::parse(o.target);
  } else {
    TESSERA_FAIL("[compile] --target '", o.target, "': expected tpu:<topology> (tpu:v6e:1x1, "
                 "tpu:v6e:2x2, tpu:v5e:2x2, ...), xla:cpu or xla:cuda");
  }
  const std::string cache = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  set_compile_cache_dir(cache);
  set_xla_compile_only(true, topology);
  require_available(device);  // no plugin, or a topology the plugin refuses: one line

  DenoiserAotOptions a;
  a.device = device;
  a.dtype = dtype_from_name(o.dtype);
  a.height = o.height;
  a.width = o.width;
  a.max_sequence_length = o.max_sequence_length;
  a.batch = o.batch;
  a.regional = o.regional;
  a.tp = o.tp;
  a.compile.backend = backend_for(device).name();
  const DenoiserAotInfo info = trace_denoiser(o.model, a);
  const std::vector<XlaAotProgram> programs = xla_aot_programs();
  set_xla_compile_only(false);
  TESSERA_CHECK(!programs.empty(), "[compile] ", info.model,
                " produced no XLA program (an op without a StableHLO lowering?)");

  const int64_t hbm = hbm_bytes(topology);
  std::printf("%s %s (%s weights, %s), %s\n", info.pipeline.c_str(), info.model.c_str(),
              gib(info.parameter_bytes).c_str(), o.dtype.c_str(), o.target.c_str());
  std::printf("inputs: %s\n", info.inputs.c_str());
  if (o.tp > 1)  // memory below is per chip: each holds its pieces of the split weights
    std::printf("tensor parallel: split by the TP plan over %d chips (SPMD, one program): %s of "
                "the weights split (%s per chip), %s replicated on every chip\n",
                o.tp, gib(info.split_parameter_bytes).c_str(),
                gib(info.split_parameter_bytes / o.tp).c_str(),
                gib(info.parameter_bytes - info.split_parameter_bytes).c_str());
  nlohmann::json rep = {{"model", o.model},       {"pipeline", info.pipeline},
                        {"denoiser", info.model}, {"target", o.target},
                        {"dtype", o.dtype},       {"height", o.height},
                        {"width", o.width},       {"regional", o.regional},
                        {"inputs", info.inputs},  {"parameter_bytes", info.parameter_bytes},
                        {"tp", o.tp},             {"split_parameter_bytes", info.split_parameter_bytes},
                        {"hbm_bytes", hbm},       {"cache_dir", cache},
                        {"programs", nlohmann::json::array()}};
  int64_t worst = 0;
  for (size_t i = 0; i < programs.size(); ++i) {
    const XlaAotProgram& p = programs[i];
    // What the chip holds while the program runs: its arguments (weights and inputs), its
    // temporaries, and outputs that do not reuse an argument's memory.
    const int64_t need = p.argument_bytes + p.temp_bytes + p.output_bytes - p.alias_bytes;
    std::printf("program %zu: %lld ops, compiled in %.1f s for %s%s, %lld bytes serialized\n", i,
                (long long)p.ops, p.compile_seconds, p.target.c_str(),
                p.partitions > 1
                    ? (", split over " + std::to_string(p.partitions) + " chips (memory per chip)")
                          .c_str()
                    : "",
                (long long)p.serialized_bytes);
    if (p.has_memory) {
      std::printf("  memory: arguments %s, temporaries %s, outputs %s (%s aliased), code %s: "
                  "%s%s\n",
                  gib(p.argument_bytes).c_str(), gib(p.temp_bytes).c_str(),
                  gib(p.output_bytes).c_str(), gib(p.alias_bytes).c_str(),
                  gib(p.code_bytes).c_str(), gib(need).c_str(),
                  hbm ? (need <= hbm ? (" - fits one chip's " + gib(hbm)).c_str()
                                     : (" - does NOT fit one chip's " + gib(hbm)).c_str())
                      : "");
      worst = std::max(worst, need);
    } else {
      std::printf("  memory: the plugin reports no memory statistics\n");
    }
    if (p.has_memory && p.peak_bytes > 0)
      std::printf("  XLA's own peak estimate: %s\n", gib(p.peak_bytes).c_str());
    std::printf("  cache: %s\n", p.cache_file.c_str());
    rep["programs"].push_back({{"ops", p.ops},
                               {"compile_seconds", p.compile_seconds},
                               {"target", p.target},
                               {"partitions", p.partitions},
                               {"has_memory", p.has_memory},
                               {"argument_bytes", p.argument_bytes},
                               {"temp_bytes", p.temp_bytes},
                               {"output_bytes", p.output_bytes},
                               {"alias_bytes", p.alias_bytes},
                               {"code_bytes", p.code_bytes},
                               {"peak_bytes", p.peak_bytes},
                               {"needed_bytes", need},
                               {"cache_file", p.cache_file},
                               {"serialized_bytes", p.serialized_bytes}});
  }
  if (o.regional && hbm) {  // every block's weights stay resident; one block runs at a time
    // Per chip: its pieces of the split weights and every replicated one.
    const int64_t resident =
        info.parameter_bytes - info.split_parameter_bytes + info.split_parameter_bytes / o.tp;
    const int64_t need = resident + worst;
    std::printf("regional: weights per chip %s + the largest program %s = %s: %s one chip's %s\n",
                gib(resident).c_str(), gib(worst).c_str(), gib(need).c_str(),
                need <= hbm ? "fits" : "does NOT fit", gib(hbm).c_str());
  }
  rep["fits"] = hbm ? nlohmann::json(worst <= hbm) : nlohmann::json();
  if (!o.report.empty()) {
    std::ofstream f(o.report);
    TESSERA_CHECK(f && (f << rep.dump(2) << "\n"), "cannot write report '", o.report, "'");
  }
  return 0;
#endif
}

}  // namespace

void register_compile(CLI::App& app, Runner& run) {
  auto o = std::make_shared<CompileCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "compile", "Compile a pipeline's denoiser ahead of time for an XLA target (no device needed "
                 "for TPU topologies) and report its memory needs");
  sub->add_option("--model", o->model, "diffusers pipeline folder (configs are enough)")
      ->required();
  sub->add_option("--target", o->target,
                  "tpu:<topology> (tpu:v6e:1x1, tpu:v6e:2x2; needs libtpu: TESSERA_LIBTPU=1 "
                  "scripts/setup.sh), xla:cpu or xla:cuda")
      ->required();
  sub->add_option("--height", o->height, "image height (default 1024)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--width", o->width, "image width (default 1024)")->check(CLI::PositiveNumber);
  sub->add_option("--max-sequence-length", o->max_sequence_length,
                  "T5 tokens (default: FLUX.1 512, SD3 256)")
      ->check(CLI::Range(1, 512));
  sub->add_option("--batch", o->batch,
                  "denoiser batch (default: the pipeline's one-image call; SD3: 2, guidance)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--dtype", o->dtype, "bf16 (default) or f32")
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_flag("--regional", o->regional,
                "one program per repeated block class (weights as inputs) instead of the whole "
                "denoiser");
  sub->add_option("--tp", o->tp,
                  "split the denoiser by its tensor-parallel plan over this many chips of the "
                  "target: one SPMD program, XLA inserting the collectives; memory is per chip")
      ->check(CLI::PositiveNumber);
  sub->add_option("--cache-dir", o->cache_dir,
                  "where the executables go (default: TESSERA_CACHE_DIR, else "
                  "~/.cache/tessera/executables)");
  sub->add_option("--report", o->report, "write a JSON report of the programs");
  sub->callback([o, &run] { run = [o] { return run_compile(*o); }; });
}

}  // namespace tessera::cli
