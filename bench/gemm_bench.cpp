// GEMM throughput at FLUX shapes: tessera linear in bf16 (the path users get: our AMX kernel on
// AMX CPUs, else oneDNN; bf16_onednn forces oneDNN for comparison) and f32 (oneDNN), and OpenBLAS
// sgemm (loaded with dlopen, for the library decision only; docs/decisions/0002-gemm-library.md).
// y[M, N] = x[M, K] @ w[N, K]^T, weights laid out as torch.nn.Linear. Threads: num_threads()
// (TESSERA_NUM_THREADS); OpenBLAS gets the same count. Side by side with PyTorch:
// bench/run_gemm_vs_torch.py.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "backends/cpu/gemm/gemm_amx.h"
#include "ops/linalg.h"
#include "runtime/cpu_features.h"
#include "runtime/parallel.h"

namespace {

using tessera::DType;
using tessera::Tensor;

// Deterministic values in [-1, 1) (no denormals, no zeros that could shortcut anything).
std::vector<float> values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(s >> 8) / float(1 << 23) - 1.0f;
  }
  return v;
}

// Mean rate, plus the best single call by wall time and by process CPU time (all threads): on a
// shared machine the best call is the one least disturbed by other processes, and FLOP per
// CPU-second x threads measures the kernel itself whatever the load. run_gemm_vs_torch.py
// compares both against torch measured the same way.
struct Best {
  double wall_s = 1e30, cpu_s = 1e30;
};

void set_flops(benchmark::State& state, int64_t m, int64_t k, int64_t n, Best best) {
  const double flops = 2.0 * double(m) * double(k) * double(n);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["best_GFLOP/s"] = flops / best.wall_s / 1e9;
  state.counters["cpu_GFLOP/s"] = flops / best.cpu_s / 1e9 * tessera::num_threads();
}

// Runs fn once per benchmark iteration and returns the fastest call.
template <typename F>
Best timed_loop(benchmark::State& state, F&& fn) {
  Best best;
  for (auto _ : state) {
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    const std::clock_t c1 = std::clock();
    best.wall_s = std::min(best.wall_s, std::chrono::duration<double>(t1 - t0).count());
    best.cpu_s = std::min(best.cpu_s, double(c1 - c0) / CLOCKS_PER_SEC);
  }
  return best;
}

void BM_tessera_linear(benchmark::State& state, DType dtype, bool repack_each_call,
                       bool onednn_only = false) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  tessera::amx_gemm::set_enabled(!onednn_only);
  const Tensor x = Tensor::from_floats(values(m * k, 1), {m, k}, dtype);
  const Tensor w = Tensor::from_floats(values(n * k, 2), {n, k}, dtype);
  tessera::clear_kernel_caches();
  if (repack_each_call) tessera::set_packed_weight_cache_capacity(0);
  benchmark::DoNotOptimize(tessera::linear(x, w).raw_data());  // warm-up: JIT, weight repack
  const Best best =
      timed_loop(state, [&] { benchmark::DoNotOptimize(tessera::linear(x, w).raw_data()); });
  tessera::set_packed_weight_cache_capacity(size_t(4) << 30);
  tessera::clear_kernel_caches();
  tessera::amx_gemm::set_enabled(true);
  set_flops(state, m, k, n, best);
  state.counters["threads"] = tessera::num_threads();
  // 1 when bf16 ran on our AMX kernel (decided as in backends/cpu/gemm.cpp: AMX CPU, K > 64).
  state.counters["amx"] = dtype == DType::bf16 && !onednn_only &&
                          tessera::cpu_isa() >= tessera::CpuIsa::amx_bf16 && k > 64;
}

// OpenBLAS through dlopen, so the engine never links it (it is only compared here).
struct OpenBlas {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  using SetThreads = void (*)(int);
  Sgemm sgemm = nullptr;
  SetThreads set_threads = nullptr;
  OpenBlas() {
    void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    sgemm = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
    set_threads = reinterpret_cast<SetThreads>(dlsym(h, "openblas_set_num_threads"));
  }
};

void BM_openblas_sgemm(benchmark::State& state) {
  static OpenBlas blas;
  if (!blas.sgemm) {
    state.SkipWithError("libopenblas.so.0 not found (apt install libopenblas0)");
    return;
  }
  if (blas.set_threads) blas.set_threads(tessera::num_threads());
  const int m = int(state.range(0)), k = int(state.range(1)), n = int(state.range(2));
  const auto x = values(int64_t(m) * k, 1), w = values(int64_t(n) * k, 2);
  std::vector<float> y(size_t(m) * size_t(n));
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  auto run = [&] {
    blas.sgemm(kRowMajor, kNoTrans, kTrans, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f, y.data(),
               n);
  };
  run();
  const Best best = timed_loop(state, [&] {
    run();
    benchmark::DoNotOptimize(y.data());
  });
  set_flops(state, m, k, n, best);
  state.counters["threads"] = tessera::num_threads();
}

// Timed calls per benchmark (after one warm-up call): GEMM_BENCH_ITERS, default 3.
int64_t iters() {
  const char* s = std::getenv("GEMM_BENCH_ITERS");
  return s && std::atoi(s) > 0 ? std::atoi(s) : 3;
}

// (M, K, N) of FLUX's transformer at 1024x1024: attention projections and the MLP.
void flux_shapes(benchmark::internal::Benchmark* b) {
  b->Args({4608, 3072, 3072})->Args({4608, 3072, 12288})->Args({4608, 12288, 3072});
  b->ArgNames({"M", "K", "N"})->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(iters());
}

BENCHMARK_CAPTURE(BM_tessera_linear, bf16, DType::bf16, false)->Apply(flux_shapes);
BENCHMARK_CAPTURE(BM_tessera_linear, bf16_onednn, DType::bf16, false, true)->Apply(flux_shapes);
BENCHMARK_CAPTURE(BM_tessera_linear, f32, DType::f32, false)->Apply(flux_shapes);
BENCHMARK(BM_openblas_sgemm)->Apply(flux_shapes);
// The cost of not caching the repacked weight (one shape is enough to see it).
BENCHMARK_CAPTURE(BM_tessera_linear, bf16_repack_each_call, DType::bf16, true)
    ->Args({4608, 3072, 3072})
    ->ArgNames({"M", "K", "N"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(iters());

}  // namespace

BENCHMARK_MAIN();
