// One FLUX transformer step (FluxTransformer2DModel.forward) per execution mode, at given image
// sizes: the dispatch-bound workload of issue 5 (the tiny fixture transformer, many small ops)
// and the compute-bound "flux-mini" of issue 4 (FLUX.1's widths, 2 double + 4 single blocks,
// weights written by bench/run_flux_vs_torch.py). Side by side with diffusers:
// bench/run_flux_vs_torch.py. Alone: build/bench/flux_bench [--model DIR] [--dtype f32|bf16]
// [--sizes 64,128,256] [--txt 64] [--modes eager,defer,compile,regional] [--iters N]
// [--warmup N] [--vae DIR (AutoencoderKL.decode at --sizes instead)] [--interleave ROUNDS] [--device D (with --interleave)]
// (with --interleave: [--turn N] steps per turn, default 8; a mode may name its own device,
// e.g. --modes compile,compile@xla:cpu)
// plus Google Benchmark's flags (--benchmark_format=json). --interleave runs the modes in turns
// of a few steps, round after round, and prints Google Benchmark-shaped JSON itself.
// Inputs are torch.randn(seed 0) draws of the forward() arguments (tessera's generator is
// torch's), so both sides run the same values; img_ids are the pipeline's (row, col) grid.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/autoencoder_kl.h"
#include "flux_bench_inputs.h"
#include "models/flux_transformer.h"
#include "ops/copy.h"
#include "runtime/backend.h"
#include "runtime/modes.h"
#include "runtime/parallel.h"
#include "runtime/primitive.h"
#include "runtime/random.h"

namespace tessera {
namespace {

struct Options {
  std::string model = "tests/fixtures/flux1-schnell-tiny/transformer";  // from the repo root
  DType dtype = DType::f32;
  std::vector<int64_t> sizes{64, 128, 256};
  int64_t txt = 64;
  std::vector<std::string> modes{"eager", "defer", "compile", "regional"};
  int64_t iters = 0;  // 0: Google Benchmark chooses
  int64_t warmup = 2;
  std::string vae;         // --vae DIR: time AutoencoderKL.decode instead of the transformer
  int64_t interleave = 0;  // rounds of turns of a few steps per mode (0: one mode after another)
  int64_t turn = 8;        // --turn: steps per turn (the first untimed)
  std::string device = "cpu";  // --device: weights and inputs there (e.g. xla:cpu), --interleave
};

// The inputs on `d` (a model moved with Module::to reads them there).
FluxTransformerInputs inputs_on(FluxTransformerInputs in, const Device& d) {
  for (Tensor* t : {&in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections,
                    &in.timestep, &in.img_ids, &in.txt_ids, &in.guidance})
    if (t->defined()) *t = t->to(d);
  return in;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The forward() arguments diffusers' FluxPipeline passes at height x width (packed 2x2 latents).
// Matmul + attention FLOPs of one step (what issue 4 divides by the GEMM ceiling).
double step_flops(const FluxTransformerConfig& c, int64_t img, int64_t txt) {
  const double d = double(c.inner_dim()), L = double(img + txt), mlp = 4.0 * d;
  double f = 2.0 * img * c.in_channels * d + 2.0 * txt * c.joint_attention_dim * d;
  f += 2.0 * (256.0 * d + d * d) * (c.guidance_embeds ? 2 : 1);  // timestep (+ guidance) MLPs
  f += 2.0 * (c.pooled_projection_dim * d + d * d);              // pooled-text MLP
  const double attn = 2.0 * 2.0 * L * L * d;                     // QK^T and PV
  // Double block: per stream 6d modulation, qkv, out, MLP; joint attention over L.
  f += c.num_layers * (2.0 * 2.0 * d * 6.0 * d + 2.0 * L * (4.0 * d * d + 2.0 * d * mlp) + attn);
  // Single block: 3d modulation, qkv + MLP in, out over (d + mlp).
  f += c.num_single_layers *
       (2.0 * d * 3.0 * d + 2.0 * L * (3.0 * d * d + d * mlp + (d + mlp) * d) + attn);
  f += 2.0 * d * 2.0 * d + 2.0 * img * d * c.in_channels;  // norm_out modulation, proj_out
  return f;
}

// eager / defer: the eager mode switch; compile / regional: strict eager with the transformer
// compiled whole (Module::compile) or per block class (compile_repeated_blocks).
void set_mode(FluxTransformer2DModel& model, const std::string& m) {
  model.reset_compile();
  set_eager_mode(m == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
  if (m == "compile")
    model.compile();
  else if (m == "regional")
    model.compile_repeated_blocks();
  else if (m != "eager" && m != "defer")
    throw std::runtime_error("[flux_bench] unknown mode '" + m +
                             "'; expected eager, defer, compile or regional");
}

void run_step(const FluxTransformer2DModel& model, const FluxTransformerInputs& in) {
  const Tensor y = model.forward(in);
  synchronize_all_devices();
  benchmark::DoNotOptimize(y.raw_data());
}

struct StepTime {
  double wall = 0, cpu = 0;  // seconds; cpu is the process's, all threads
};

StepTime timed_step(const FluxTransformer2DModel& model, const FluxTransformerInputs& in) {
  const std::clock_t c0 = std::clock();
  const auto t0 = std::chrono::steady_clock::now();
  run_step(model, in);
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          double(std::clock() - c0) / CLOCKS_PER_SEC};
}

void bench_step(benchmark::State& st, FluxTransformer2DModel* model, std::string mode, int64_t size,
                int64_t txt, int64_t warmup) {
  const FluxTransformerInputs in = bench::random_flux_inputs(model->config, size, size, txt, model->dtype());
  set_mode(*model, mode);
  for (int64_t i = 0; i < warmup; ++i) run_step(*model, in);
  reset_mode_stats();
  double best_wall = 1e30, best_cpu = 1e30, sum_cpu = 0;
  int64_t n = 0;
  for (auto _ : st) {
    const StepTime t = timed_step(*model, in);
    best_wall = std::min(best_wall, t.wall);
    best_cpu = std::min(best_cpu, t.cpu);
    sum_cpu += t.cpu;
    ++n;
  }
  const ModeStats s = mode_stats();
  set_mode(*model, "eager");
  const int64_t img = (size / 16) * (size / 16);
  const double flops = step_flops(model->config, img, txt);
  st.counters["best_ms"] = best_wall * 1e3;
  st.counters["best_cpu_ms"] = best_cpu * 1e3;
  st.counters["mean_cpu_ms"] = n ? sum_cpu / double(n) * 1e3 : 0.0;
  st.counters["threads"] = num_threads();
  st.counters["GFLOP"] = flops / 1e9;
  st.counters["best_GFLOP/s"] = flops / best_wall / 1e9;
  st.counters["cpu_GFLOP/s"] = flops / best_cpu / 1e9 * num_threads();
  st.counters["ops_per_step"] = n ? double(s.ops_dispatched) / double(n) : 0.0;
  st.counters["fused_per_step"] = n ? double(s.fused_kernels) / double(n) : 0.0;
  st.counters["compiles"] = double(s.compiles);
  st.counters["cache_hits"] = double(s.cache_hits);
}

// One AutoencoderKL.decode of a (1, latent_channels, size / 8, size / 8) torch.randn latent.
void bench_vae(benchmark::State& st, const AutoencoderKL* vae, int64_t size, int64_t warmup,
               DType dtype) {
  Generator g(0);
  Tensor z = randn({1, vae->config().latent_channels, size / 8, size / 8}, DType::f32, g);
  if (dtype != DType::f32) z = astype(z, dtype);
  auto run = [&] {
    const Tensor y = vae->decode(z);
    synchronize();
    benchmark::DoNotOptimize(y.raw_data());
  };
  for (int64_t i = 0; i < warmup; ++i) run();
  double best_wall = 1e30, best_cpu = 1e30;
  for (auto _ : st) {
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best_wall = std::min(
        best_wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    best_cpu = std::min(best_cpu, double(std::clock() - c0) / CLOCKS_PER_SEC);
  }
  st.counters["best_ms"] = best_wall * 1e3;
  st.counters["best_cpu_ms"] = best_cpu * 1e3;
  st.counters["threads"] = num_threads();
}

// The modes take turns of a few steps each, round after round: on a shared machine the other
// processes' load then falls on every mode alike, where one mode after another can catch a quiet
// and a busy minute. Each mode keeps its own model (a compiled module stays compiled); eager and
// defer share one (the switch is global). Per mode: best / mean / median CPU ms of the timed
// steps, and the median of (eager CPU / this mode's CPU) over the i-th timed steps of each round.
void run_interleaved(const Options& o) {
  const std::string dt = dtype_name(o.dtype);
  std::ostringstream js;
  js << "{\"benchmarks\": [";
  bool first = true;
  for (int64_t size : o.sizes) {
    // A mode may name its device ("compile@xla:cpu"): devices then run side by side in turns.
    std::vector<std::string> mode_of;
    std::vector<Device> device_of;
    for (const auto& m : o.modes) {
      const size_t at = m.find('@');
      mode_of.push_back(m.substr(0, at));
      device_of.push_back(Device::parse(at == std::string::npos ? o.device : m.substr(at + 1)));
    }
    std::vector<std::unique_ptr<FluxTransformer2DModel>> models;
    std::vector<FluxTransformer2DModel*> of_mode;
    std::map<std::string, FluxTransformer2DModel*> shared_eager;  // per device
    for (size_t k = 0; k < o.modes.size(); ++k) {
      const std::string& m = mode_of[k];
      const std::string dev = device_of[k].str();
      if ((m == "eager" || m == "defer") && shared_eager.count(dev)) {
        of_mode.push_back(shared_eager[dev]);
        continue;
      }
      models.push_back(FluxTransformer2DModel::from_pretrained(o.model, o.dtype));
      models.back()->to(device_of[k]);
      of_mode.push_back(models.back().get());
      if (m == "eager" || m == "defer") shared_eager[dev] = models.back().get();
    }
    const FluxTransformerInputs host_in =
        bench::random_flux_inputs(models[0]->config, size, size, o.txt, models[0]->dtype());
    std::map<std::string, FluxTransformerInputs> in_on;  // the same inputs on each device
    for (const Device& d : device_of)
      if (!in_on.count(d.str())) in_on[d.str()] = inputs_on(host_in, d);
    const size_t nm = o.modes.size();
    std::vector<ModeStats> stats(nm);
    std::vector<std::vector<double>> cpu(nm), wall(nm);
    auto step = [&](size_t k, bool timed) {
      set_eager_mode(mode_of[k] == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
      const ModeStats before = mode_stats();
      const StepTime t = timed_step(*of_mode[k], in_on[device_of[k].str()]);
      set_eager_mode(EagerMode::DeferNever);
      if (!timed) return;
      const ModeStats after = mode_stats();
      stats[k].ops_dispatched += after.ops_dispatched - before.ops_dispatched;
      stats[k].fused_kernels += after.fused_kernels - before.fused_kernels;
      cpu[k].push_back(t.cpu * 1e3);
      wall[k].push_back(t.wall * 1e3);
    };
    for (size_t k = 0; k < nm; ++k) {
      CompileOptions copt;
      copt.backend = backend_for(device_of[k]).name();
      if (mode_of[k] == "compile") of_mode[k]->compile(copt);
      if (mode_of[k] == "regional") of_mode[k]->compile_repeated_blocks(copt);
      for (int64_t i = 0; i < std::max<int64_t>(o.warmup, 1); ++i) step(k, false);
    }
    // A turn is --turn steps of one mode; the first re-warms the caches the other modes used
    // (back to back, as in a denoising loop) and is not timed.
    for (int64_t r = 0; r < o.interleave; ++r)
      for (size_t k = 0; k < nm; ++k)
        for (int64_t i = 0; i < o.turn; ++i) step(k, i > 0);
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    // Ratios against eager, else against the first mode listed.
    const auto eager_it = std::find(o.modes.begin(), o.modes.end(), "eager");
    const size_t ke = eager_it == o.modes.end() ? 0 : size_t(eager_it - o.modes.begin());
    for (size_t k = 0; k < nm; ++k) {
      const auto& c = cpu[k];
      const auto& w = wall[k];
      double sum_w = 0, sum_c = 0;
      for (size_t i = 0; i < c.size(); ++i) sum_w += w[i], sum_c += c[i];
      std::vector<double> ratios;
      for (size_t i = 0; i < c.size(); ++i) ratios.push_back(cpu[ke][i] / c[i]);
      const double n = double(std::max<size_t>(c.size(), 1));
      js << (first ? "" : ",") << "\n {\"run_name\": \"flux_step/" << dt << "/" << size << "/"
         << o.modes[k] << "\", \"real_time\": " << sum_w / n
         << ", \"best_ms\": " << *std::min_element(w.begin(), w.end())
         << ", \"best_cpu_ms\": " << *std::min_element(c.begin(), c.end())
         << ", \"mean_cpu_ms\": " << sum_c / n << ", \"median_cpu_ms\": " << median(c)
         << ", \"median_round_ratio\": " << median(ratios) << ", \"rounds\": " << c.size()
         << ", \"threads\": " << num_threads()
         << ", \"GFLOP\": " << step_flops(models[0]->config, (size / 16) * (size / 16), o.txt) / 1e9
         << ", \"ops_per_step\": " << double(stats[k].ops_dispatched) / n
         << ", \"fused_per_step\": " << double(stats[k].fused_kernels) / n << "}";
      first = false;
    }
  }
  js << "\n]}\n";
  std::cout << js.str();
}

int main_impl(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("[flux_bench] " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") {
      o.model = value();
    } else if (a == "--dtype") {
      const std::string d = value();
      if (d != "f32" && d != "bf16")
        throw std::runtime_error("[flux_bench] --dtype " + d + ": expected f32 or bf16");
      o.dtype = d == "bf16" ? DType::bf16 : DType::f32;
    } else if (a == "--sizes") {
      o.sizes.clear();
      for (const auto& s : split(value())) o.sizes.push_back(std::stoll(s));
    } else if (a == "--txt") {
      o.txt = std::stoll(value());
    } else if (a == "--modes") {
      o.modes = split(value());
    } else if (a == "--iters") {
      o.iters = std::stoll(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoll(value());
    } else if (a == "--vae") {
      o.vae = value();
    } else if (a == "--device") {
      o.device = value();
    } else if (a == "--turn") {
      o.turn = std::stoll(value());
      if (o.turn < 2) throw std::runtime_error("[flux_bench] --turn needs >= 2 steps");
    } else if (a == "--interleave") {
      o.interleave = std::stoll(value());
      if (o.interleave <= 0) throw std::runtime_error("[flux_bench] --interleave needs rounds > 0");
    } else {
      throw std::runtime_error("[flux_bench] unknown argument '" + a +
                               "'; expected --model, --dtype, --sizes, --txt, --modes, --iters, "
                               "--warmup, --vae, --interleave, --turn, --device or Google Benchmark flags");
    }
  }
  for (int64_t s : o.sizes)
    if (s <= 0 || s % 16 != 0)
      throw std::runtime_error("[flux_bench] size " + std::to_string(s) +
                               " must be a positive multiple of 16");
  const std::string dt = dtype_name(o.dtype);
  if (!o.vae.empty()) {
    const auto vae = AutoencoderKL::from_pretrained(o.vae, o.dtype);
    for (int64_t size : o.sizes) {
      auto* b = benchmark::RegisterBenchmark(
          ("vae_decode/" + dt + "/" + std::to_string(size) + "/eager").c_str(), bench_vae,
          vae.get(), size, o.warmup, o.dtype);
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      if (o.iters > 0) b->Iterations(o.iters);
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
  if (o.interleave > 0) {
    run_interleaved(o);
    return 0;
  }
  const auto model = FluxTransformer2DModel::from_pretrained(o.model, o.dtype);
  for (int64_t size : o.sizes)
    for (const auto& mode : o.modes) {
      auto* b = benchmark::RegisterBenchmark(
          ("flux_step/" + dt + "/" + std::to_string(size) + "/" + mode).c_str(), bench_step,
          model.get(), mode, size, o.txt, o.warmup);
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      if (o.iters > 0) b->Iterations(o.iters);
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  try {
    return tessera::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
