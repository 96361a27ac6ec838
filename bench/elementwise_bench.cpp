// Memory-bound elementwise and norm kernels at FLUX activation sizes (4096 image + 512 text
// tokens x 3072 channels) and a VAE decoder group norm. Compare with
// bench/run_elementwise_vs_torch.py on the same machine and thread count.
#include <benchmark/benchmark.h>

#include <algorithm>

#include "ops/elementwise.h"
#include "ops/norm.h"

namespace tessera {
namespace {

constexpr int64_t kTokens = 4608, kDim = 3072;

Tensor filled(const Shape& s, DType t) {
  std::vector<float> v(size_t(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int64_t(i % 97) - 48) / 17.f;
  return Tensor::from_floats(v, s, t);
}

DType dtype_arg(const benchmark::State& st) {
  return st.range(0) ? DType::bf16 : DType::f32;
}

void set_bytes(benchmark::State& st, int64_t n, DType t, int tensors) {
  st.SetBytesProcessed(int64_t(st.iterations()) * n * int64_t(dtype_size(t)) * tensors);
}

void BM_AddSameShape(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({kTokens, kDim}, t), b = filled({kTokens, kDim}, t);
  for (auto _ : st) benchmark::DoNotOptimize(add(a, b));
  set_bytes(st, a.numel(), t, 3);
}

// Gated residual: x + gate[1, 1, D] * y, the AdaLN pattern of every FLUX block.
void BM_MulRowBroadcast(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({1, kTokens, kDim}, t), g = filled({1, 1, kDim}, t);
  for (auto _ : st) benchmark::DoNotOptimize(mul(a, g));
  set_bytes(st, a.numel(), t, 2);
}

void BM_Silu(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({kTokens, kDim}, t);
  for (auto _ : st) benchmark::DoNotOptimize(silu(a));
  set_bytes(st, a.numel(), t, 2);
}

void BM_GeluTanh(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({kTokens, 4 * kDim / 4}, t);
  for (auto _ : st) benchmark::DoNotOptimize(gelu(a, true));
  set_bytes(st, a.numel(), t, 2);
}

void BM_LayerNorm(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({kTokens, kDim}, t);
  for (auto _ : st) benchmark::DoNotOptimize(layer_norm(a, Tensor(), Tensor(), 1e-6));
  set_bytes(st, a.numel(), t, 2);
}

void BM_RmsNorm(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({kTokens, kDim}, t), w = filled({kDim}, t);
  for (auto _ : st) benchmark::DoNotOptimize(rms_norm(a, w, 1e-6));
  set_bytes(st, a.numel(), t, 2);
}

void BM_GroupNorm(benchmark::State& st) {
  const DType t = dtype_arg(st);
  const Tensor a = filled({1, 512, 128, 128}, t), w = filled({512}, t), b = filled({512}, t);
  for (auto _ : st) benchmark::DoNotOptimize(group_norm(a, 32, w, b, 1e-6));
  set_bytes(st, a.numel(), t, 2);
}

double min_of(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// The machine is shared: compare the best of the repetitions, as the torch script does.
#define ELEM_BENCH(fn)                   \
  BENCHMARK(fn)                          \
      ->ArgName("bf16")                  \
      ->Arg(0)                           \
      ->Arg(1)                           \
      ->Unit(benchmark::kMillisecond)    \
      ->UseRealTime()                    \
      ->Repetitions(10)                  \
      ->ComputeStatistics("min", min_of) \
      ->ReportAggregatesOnly(true)
ELEM_BENCH(BM_AddSameShape);
ELEM_BENCH(BM_MulRowBroadcast);
ELEM_BENCH(BM_Silu);
ELEM_BENCH(BM_GeluTanh);
ELEM_BENCH(BM_LayerNorm);
ELEM_BENCH(BM_RmsNorm);
ELEM_BENCH(BM_GroupNorm);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
