// torch-compatible randn at diffusers latent shapes; compare with
//   python -c "import torch,timeit; ..." (see docs/decisions/0004-torch-rng.md).
#include <benchmark/benchmark.h>

#include "runtime/random.h"

namespace {

void BM_randn(benchmark::State& state, tessera::Shape shape, tessera::DType dtype) {
  tessera::Generator g(0);
  for (auto _ : state) benchmark::DoNotOptimize(tessera::randn(shape, dtype, g).raw_data());
  state.SetItemsProcessed(state.iterations() * tessera::shape_numel(shape));
}

BENCHMARK_CAPTURE(BM_randn, flux_latent_f32, tessera::Shape{1, 16, 128, 128}, tessera::DType::f32)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_randn, flux_latent_bf16, tessera::Shape{1, 16, 128, 128}, tessera::DType::bf16)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_randn, packed_f32, tessera::Shape{1, 4096, 64}, tessera::DType::f32)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
