// SDPA at the FLUX shape: B=1, 24 heads, 4608 tokens, head dim 128, f32 and bf16, 2 threads.
// bench/run_attention_vs_torch.py runs this next to torch's scaled_dot_product_attention.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstdlib>
#include <vector>

#include "backends/cpu/attention/attention_kernels.h"
#include "ops/attention.h"
#include "runtime/parallel.h"

namespace {

using namespace tessera;

// Process CPU seconds (all threads): on a shared, loaded machine this tracks the work done
// better than wall time, so run_attention_vs_torch.py reports both.
double process_cpu_seconds() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

Tensor random_tensor(const Shape& shape, DType dt, uint32_t seed) {
  std::vector<float> v(size_t(shape_numel(shape)));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(int32_t(s >> 8) % 2001 - 1000) / 500.f;
  }
  return Tensor::from_floats(v, shape, dt);
}

void BM_Sdpa(benchmark::State& state, DType dt, cpu::AttentionPath path) {
  const int64_t H = 24, L = 4608, D = 128;
  cpu::set_attention_path(path);
  set_num_threads(std::getenv("TESSERA_NUM_THREADS") ? num_threads() : 2);
  const Tensor q = random_tensor({1, H, L, D}, dt, 1), k = random_tensor({1, H, L, D}, dt, 2),
               v = random_tensor({1, H, L, D}, dt, 3);
  benchmark::DoNotOptimize(scaled_dot_product_attention(q, k, v));  // warm-up: primitive cache
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) benchmark::DoNotOptimize(scaled_dot_product_attention(q, k, v));
  state.counters["cpu_s_per_call"] = (process_cpu_seconds() - cpu0) / double(state.iterations());
  const double flops = 4.0 * H * L * L * D;  // QK^T and PV, 2 flops per multiply-add
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = num_threads();
  cpu::set_attention_path(cpu::AttentionPath::automatic);
}

// ~0.26 TFLOP per call: few repetitions, fixed iteration count. bf16 and f32 are the default paths
// (the AMX kernels where the CPU has AMX; f32 through split bf16 products,
// TESSERA_SDPA_F32_PRODUCTS picks 3/4/6); *_onednn force the oneDNN-tile path for comparison.
BENCHMARK_CAPTURE(BM_Sdpa, bf16, DType::bf16, cpu::AttentionPath::automatic)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Sdpa, bf16_onednn, DType::bf16, cpu::AttentionPath::tiled)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_Sdpa, f32, DType::f32, cpu::AttentionPath::automatic)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
// f32_onednn: the oneDNN-tile f32 path (what TESSERA_CPU_ISA=avx512_bf16 and CPUs without AMX get).
BENCHMARK_CAPTURE(BM_Sdpa, f32_onednn, DType::f32, cpu::AttentionPath::tiled)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
