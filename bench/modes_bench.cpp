// Execution modes on a dispatch-bound workload: many small elementwise ops (the shape of a
// modulated norm + activation + residual per block), strict eager (synchronous and on the
// asynchronous stream) against deferred-and-fused. Run: build/bench/modes_bench
#include <benchmark/benchmark.h>

#include "ops/elementwise.h"
#include "ops/norm.h"
#include "runtime/compile.h"
#include "runtime/graph.h"
#include "runtime/modes.h"
#include "runtime/random.h"

namespace tessera {
namespace {

// 8 blocks x 7 ops on (1, tokens, 64): norm -> modulate -> silu -> gate -> residual.
Tensor blocks(Tensor x, const Tensor& scale1, const Tensor& shift, const Tensor& gate) {
  for (int b = 0; b < 8; ++b) {
    const Tensor h = silu(layer_norm(x, Tensor(), Tensor(), 1e-6) * scale1 + shift);
    x = x + gate * (h * 0.5);
  }
  return x;
}

void run_mode(benchmark::State& st, EagerMode mode, bool async, DType dt) {
  const int64_t tokens = st.range(0);
  Generator g(0);
  const Tensor x = randn({1, tokens, 64}, dt, g), scale1 = randn({1, 1, 64}, dt, g) + 1.0,
               shift = randn({1, 1, 64}, dt, g), gate = randn({1, 1, 64}, dt, g);
  set_eager_mode(mode);
  set_async_dispatch(async);
  reset_mode_stats();
  for (auto _ : st) {
    Tensor y = blocks(x, scale1, shift, gate);
    synchronize();
    benchmark::DoNotOptimize(y.raw_data());
  }
  const ModeStats s = mode_stats();
  st.counters["compiles"] = double(s.compiles);
  st.counters["cache_hits"] = double(s.cache_hits);
  st.counters["fused_kernels"] = double(s.fused_kernels);
  set_eager_mode(EagerMode::DeferNever);
  set_async_dispatch(false);
}

void BM_eager_sync(benchmark::State& s) {
  run_mode(s, EagerMode::DeferNever, false, DType::f32);
}
void BM_eager_async(benchmark::State& s) {
  run_mode(s, EagerMode::DeferNever, true, DType::f32);
}
void BM_defer_fuse(benchmark::State& s) {
  run_mode(s, EagerMode::DeferAndFuse, false, DType::f32);
}
void BM_eager_sync_bf16(benchmark::State& s) {
  run_mode(s, EagerMode::DeferNever, false, DType::bf16);
}
void BM_defer_fuse_bf16(benchmark::State& s) {
  run_mode(s, EagerMode::DeferAndFuse, false, DType::bf16);
}

// One compiled modulated norm, FLUX's norm1: layer_norm(x) * (1 + scale) + shift on
// (1, tokens, width), the fused kernel a compiled step runs 9 times per tiny-FLUX step.
void BM_compiled_norm_modulate(benchmark::State& st) {
  const int64_t tokens = st.range(0), width = st.range(1);
  Generator g(0);
  const Tensor x = randn({1, tokens, width}, DType::f32, g),
               scale = randn({1, 1, width}, DType::f32, g),
               shift = randn({1, 1, width}, DType::f32, g);
  const Tensor scale1 = scale + 1.0;
  CompiledFunction f("norm_modulate", CompileOptions{});
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{layer_norm(in[0], Tensor(), Tensor(), 1e-6) * in[1] + in[2]};
  };
  for (auto _ : st) {
    Tensor y = f({x, scale1, shift}, fn)[0];
    benchmark::DoNotOptimize(y.raw_data());
  }
}

BENCHMARK(BM_compiled_norm_modulate)
    ->Args({64, 32})
    ->Args({128, 32})
    ->Args({256, 32})
    ->Args({1024, 3072});
BENCHMARK(BM_eager_sync)->Arg(16)->Arg(256)->Arg(4096);
BENCHMARK(BM_eager_async)->Arg(16)->Arg(256)->Arg(4096);
BENCHMARK(BM_defer_fuse)->Arg(16)->Arg(256)->Arg(4096);
BENCHMARK(BM_eager_sync_bf16)->Arg(256)->Arg(4096);
BENCHMARK(BM_defer_fuse_bf16)->Arg(256)->Arg(4096);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
