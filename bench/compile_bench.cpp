// Compiled mode against strict eager (docs/benchmarks.md, "Compiled mode"):
//  * dispatch-bound: one step of the tiny fixture FLUX transformer at 64..256 px, eager vs
//    compile() vs compile_repeated_blocks() (best wall and CPU time of N steps);
//  * flux-deep: FLUX.1's depth (19 double + 38 single blocks) at a small width with random
//    weights: trace+plan time of a full compile vs regional compile, and per-step time of each.
// Run from the repo root: build/bench/compile_bench [--iters N] [--sizes 64,128,256]
// [--deep-width 64] [--deep 0|1] [--dtype f32|bf16] [--only eager|compile|regional]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "flux_bench_inputs.h"
#include "models/flux_transformer.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "runtime/modes.h"
#include "runtime/parallel.h"
#include "runtime/primitive.h"
#include "runtime/random.h"

namespace tessera {
namespace {

struct Options {
  int iters = 30;
  std::vector<int64_t> sizes{64, 128, 256};
  int64_t deep_width = 64;  // heads * head_dim of flux-deep (2 heads)
  DType dtype = DType::f32;
  bool deep = true;
  std::string only;  // "eager", "compile" or "regional": time that mode alone (for profiling)
};

struct Timing {
  double wall_ms = 1e30, cpu_ms = 1e30;
};

// Best of `iters` steps (wall and process CPU time), after one warm-up step.
Timing time_steps(const FluxTransformer2DModel& m, const FluxTransformerInputs& in, int iters) {
  m.forward(in).raw_data();
  Timing t;
  for (int i = 0; i < iters; ++i) {
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    m.forward(in).raw_data();
    synchronize();
    t.wall_ms = std::min(
        t.wall_ms,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    t.cpu_ms = std::min(t.cpu_ms, 1e3 * double(std::clock() - c0) / CLOCKS_PER_SEC);
  }
  return t;
}

void dispatch_bound(const Options& o) {
  auto m = FluxTransformer2DModel::from_pretrained("tests/fixtures/flux1-schnell-tiny/transformer",
                                                   o.dtype);
  std::printf("dispatch-bound: tiny FLUX transformer (%s), one step, best of %d\n",
              dtype_name(o.dtype), o.iters);
  std::printf("%6s %10s %10s %10s %10s %10s %10s %8s %8s\n", "size", "eager_ms", "eager_cpu",
              "full_ms", "full_cpu", "region_ms", "region_cpu", "full_x", "region_x");
  for (int64_t size : o.sizes) {
    const FluxTransformerInputs in = bench::random_flux_inputs(m->config, size, size, 64, o.dtype);
    auto run = [&](const char* mode) {
      if (!o.only.empty() && o.only != mode) return Timing{};
      m->reset_compile();
      if (std::strcmp(mode, "compile") == 0) m->compile();
      if (std::strcmp(mode, "regional") == 0) m->compile_repeated_blocks();
      const Timing t = time_steps(*m, in, o.iters);
      m->reset_compile();
      return t;
    };
    const Timing e = run("eager"), f = run("compile"), r = run("regional");
    std::printf("%6lld %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f\n",
                static_cast<long long>(size), e.wall_ms, e.cpu_ms, f.wall_ms, f.cpu_ms, r.wall_ms,
                r.cpu_ms, e.wall_ms / f.wall_ms, e.wall_ms / r.wall_ms);
  }
}

void flux_deep(const Options& o) {
  FluxTransformerConfig c;
  c.num_layers = 19;
  c.num_single_layers = 38;
  c.num_attention_heads = 2;
  c.attention_head_dim = o.deep_width / 2;
  const int64_t ax = c.attention_head_dim / 8 * 2;  // rope axes: (hd - 2*ax, ax, ax), all even
  c.axes_dims_rope = {c.attention_head_dim - 2 * ax, ax, ax};
  c.joint_attention_dim = 64;
  c.pooled_projection_dim = 32;
  // Two copies with the same weights, one compiled whole and one per block class, so their steps
  // can be timed in turns (decision 0014): a slow spell of a shared machine then hits both.
  FluxTransformer2DModel m(c), mr(c);
  std::map<std::string, Tensor> w;
  Generator g(1);
  for (const auto& p : m.named_parameters())
    w[p.name] = astype(randn(p.shape, DType::f32, g) * 0.02, o.dtype);
  m.load_weights(MapWeightSource(w), {.dtype = o.dtype});
  mr.load_weights(MapWeightSource(std::move(w)), {.dtype = o.dtype});
  const FluxTransformerInputs in = bench::random_flux_inputs(c, 128, 128, 64, o.dtype);
  std::printf("\nflux-deep: 19 double + 38 single blocks, width %lld (%s), 128x128, txt 64\n",
              static_cast<long long>(c.inner_dim()), dtype_name(o.dtype));
  const Timing e = time_steps(m, in, o.iters / 3 + 1);
  auto compile_once = [&](FluxTransformer2DModel& model, bool regional) {
    model.reset_compile();
    if (regional)
      model.compile_repeated_blocks();
    else
      model.compile();
    reset_mode_stats();
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(in).raw_data();
    const double first =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double plan_ms = mode_stats().compile_seconds * 1e3;
    std::printf("%-9s trace+plan %8.2f ms  first call %8.2f ms\n", regional ? "regional" : "full",
                plan_ms, first);
    return plan_ms;
  };
  std::printf("%-9s step %8.3f ms (cpu %8.3f)\n", "eager", e.wall_ms, e.cpu_ms);
  const double full_plan = compile_once(m, false), reg_plan = compile_once(mr, true);
  // Rounds of two steps each, full then regional; per round the ratio of the two bests.
  Timing full, reg;
  std::vector<double> ratios;
  for (int r = 0; r < std::max(3, o.iters / 3); ++r) {
    const Timing f = time_steps(m, in, 2), q = time_steps(mr, in, 2);
    full.wall_ms = std::min(full.wall_ms, f.wall_ms);
    full.cpu_ms = std::min(full.cpu_ms, f.cpu_ms);
    reg.wall_ms = std::min(reg.wall_ms, q.wall_ms);
    reg.cpu_ms = std::min(reg.cpu_ms, q.cpu_ms);
    ratios.push_back(q.cpu_ms / f.cpu_ms);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "full      step %8.3f ms (cpu %8.3f)\nregional  step %8.3f ms (cpu %8.3f), %zu rounds\n",
      full.wall_ms, full.cpu_ms, reg.wall_ms, reg.cpu_ms, ratios.size());
  std::printf(
      "regional/full compile time %.3f; regional/full step time %.3f (median paired CPU ratio "
      "%.3f); full vs eager %.2fx\n",
      reg_plan / full_plan, reg.wall_ms / full.wall_ms, ratios[ratios.size() / 2],
      e.wall_ms / full.wall_ms);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--iters") {
      o.iters = std::atoi(v.c_str());
    } else if (k == "--deep-width") {
      o.deep_width = std::atoll(v.c_str());
    } else if (k == "--only") {
      o.only = v;
    } else if (k == "--deep") {
      o.deep = v != "0";
    } else if (k == "--dtype") {
      o.dtype = tessera::dtype_from_name(v);
    } else if (k == "--sizes") {
      o.sizes.clear();
      for (size_t p = 0; p < v.size();) {
        const size_t q = v.find(',', p);
        o.sizes.push_back(std::atoll(v.substr(p, q - p).c_str()));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "[compile_bench] unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::printf("threads %d\n", tessera::num_threads());
  tessera::dispatch_bound(o);
  if (o.deep) tessera::flux_deep(o);
  return 0;
}
