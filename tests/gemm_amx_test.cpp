// The AMX bf16 GEMM (backends/cpu/gemm_amx.h) behind linear and matmul: against an exact
// reference rounded once to bf16 and against the oneDNN path, on shapes with M, K and N tails,
// M = 1, bias or none, batched and broadcast matmul, and transposed or strided operands.
#include "backends/cpu/gemm/gemm_amx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/copy.h"
#include "ops/linalg.h"
#include "runtime/cpu_features.h"
#include "runtime/dtype.h"
#include "test_util.h"

namespace tessera {
namespace {

bool have_amx() {
  return cpu_isa() >= CpuIsa::amx_bf16;
}

#define SKIP_WITHOUT_AMX()                                                      \
  if (!have_amx())                                                              \
  GTEST_SKIP() << "no AMX-BF16 here (or TESSERA_CPU_ISA caps it): cpu_isa() = " \
               << cpu_isa_name(cpu_isa())

Tensor random_bf16(const Shape& shape, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (auto& x : v) x = u(g);
  return Tensor::from_floats(v, shape, DType::bf16);
}

// Runs fn with the AMX kernel switched off (bf16 then goes to oneDNN).
template <typename F>
Tensor on_onednn(F&& fn) {
  amx_gemm::set_enabled(false);
  Tensor t = contiguous(fn());
  t.raw_data();
  amx_gemm::set_enabled(true);
  return t;
}

// Distance in bf16 steps between two finite bf16 values (across zero too).
int64_t ulps(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t h) { return (h & 0x8000) ? -int64_t(h & 0x7fff) : int64_t(h); };
  return std::llabs(ordered(a) - ordered(b));
}

// Every element of `actual` (bf16 [rows, N] as floats) is within one bf16 ulp of the exact sum
// rounded to bf16, allowing also for fp32 accumulation's own bound K * 2^-24 * sum|a*b| (which
// matters only where the terms cancel). exact/mag: the exact sum (+ bias) and sum |a*b|.
::testing::AssertionResult matches_exact(const std::vector<float>& actual,
                                         const std::vector<double>& exact,
                                         const std::vector<double>& mag, int64_t K) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const uint16_t want = f32_to_bf16(float(exact[i])), got = f32_to_bf16(actual[i]);
    const double slack = double(K) * std::ldexp(1.0, -24) * mag[i];
    const bool ok = ulps(got, want) <= 1 || std::fabs(double(actual[i]) - exact[i]) <= slack;
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements beyond 1 bf16 ulp; first at " << first
         << ": " << actual[first] << " vs exact " << exact[first];
}

// The exact y = x @ w^T (+ b) for x [M, K], w [N, K], in double from the bf16 values.
void exact_linear(const Tensor& x, const Tensor& w, const Tensor& b, std::vector<double>& y,
                  std::vector<double>& mag) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  const auto xv = x.to_floats(), wv = w.to_floats();
  const auto bv = b.defined() ? b.to_floats() : std::vector<float>(size_t(N), 0.0f);
  y.assign(size_t(M * N), 0.0);
  mag.assign(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bv[size_t(n)], a = std::fabs(double(bv[size_t(n)]));
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(xv[size_t(m * K + k)]) * double(wv[size_t(n * K + k)]);
        s += p;
        a += std::fabs(p);
      }
      y[size_t(m * N + n)] = s;
      mag[size_t(m * N + n)] = a;
    }
}

// The kernel itself (whatever linear dispatches to): y = x @ w^T + b through pack_b and gemm.
Tensor kernel_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  std::vector<uint16_t> packed(amx_gemm::packed_b_elems(K, N));
  amx_gemm::pack_b(static_cast<const uint16_t*>(w.raw_data()), 1, K, K, N, packed.data());
  const std::vector<float> bias = b.defined() ? b.to_floats() : std::vector<float>();
  Tensor y = Tensor::empty({M, N}, DType::bf16);
  amx_gemm::Problem p;
  p.a = static_cast<const uint16_t*>(x.raw_data());
  p.sam = K;
  p.b_packed = packed.data();
  p.bias = bias.empty() ? nullptr : bias.data();
  p.c = static_cast<uint16_t*>(y.raw_data());
  p.ldc = N;
  p.M = M;
  p.K = K;
  p.N = N;
  amx_gemm::gemm({p});
  return y;
}

TEST(GemmAmx, LinearMatchesExactAndOneDnnOnTailShapes) {
  SKIP_WITHOUT_AMX();
  uint32_t seed = 1;
  for (int64_t M : {1, 7, 16, 33, 100})
    for (int64_t K : {8, 40, 64, 100, 3072})
      for (int64_t N : {1, 17, 32, 96})
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "M " << M << " K " << K << " N " << N
                                            << (with_bias ? " bias" : " no bias"));
          const Tensor x = random_bf16({M, K}, seed++), w = random_bf16({N, K}, seed++);
          const Tensor b = with_bias ? random_bf16({N}, seed++) : Tensor();
          std::vector<double> exact, mag;
          exact_linear(x, w, b, exact, mag);
          const Tensor yk = kernel_linear(x, w, b);
          EXPECT_TRUE(matches_exact(yk.to_floats(), exact, mag, K)) << "kernel";
          const Tensor y = linear(x, w, b);
          EXPECT_TRUE(matches_exact(y.to_floats(), exact, mag, K)) << "linear";
          const Tensor ref = on_onednn([&] { return linear(x, w, b); });
          EXPECT_TRUE(test::bf16_close(yk, ref, 0.0)) << "kernel vs oneDNN";
          if (K > 64) EXPECT_TRUE(test::bit_equal(y, yk)) << "linear takes the AMX kernel";
        }
}

TEST(GemmAmx, FluxSizedLinearMatchesOneDnn) {
  SKIP_WITHOUT_AMX();
  // Several row blocks, panels and K chunks, with an M tail (M % 32 != 0).
  const Tensor x = random_bf16({300, 1000}, 7), w = random_bf16({1100, 1000}, 8);
  const Tensor b = random_bf16({1100}, 9);
  const Tensor y = linear(x, w, b);
  const Tensor ref = on_onednn([&] { return linear(x, w, b); });
  EXPECT_TRUE(test::bf16_close(y, ref, 0.0));
  // And one row against the exact sum.
  std::vector<double> exact, mag;
  exact_linear(x.slice(0, 299, 300), w, b, exact, mag);
  EXPECT_TRUE(matches_exact(y.slice(0, 299, 300).to_floats(), exact, mag, 1000));
}

TEST(GemmAmx, StridedAndTransposedOperands) {
  SKIP_WITHOUT_AMX();
  const Tensor x = random_bf16({20, 50}, 11), w = random_bf16({24, 50}, 12);
  const Tensor want = on_onednn([&] { return linear(x, w); });
  // x laid out transposed (unit stride along M), w likewise, every other row of a bigger x.
  const Tensor xt = contiguous(x.transpose(0, 1)).transpose(0, 1);
  const Tensor wt = contiguous(w.transpose(0, 1)).transpose(0, 1);
  EXPECT_TRUE(test::bit_equal(linear(xt, wt), linear(x, w)));
  EXPECT_TRUE(test::bf16_close(linear(xt, wt), want, 0.0));
  const Tensor big = random_bf16({40, 50}, 13);
  const Tensor rows = big.slice(0, 0, 40, 2);
  EXPECT_TRUE(test::bit_equal(linear(rows, w), linear(contiguous(rows), w)));
  // matmul with b as a transposed view (q @ k^T).
  EXPECT_TRUE(test::bit_equal(matmul(x, w.transpose(0, 1)), linear(x, w)));
}

TEST(GemmAmx, BatchedAndBroadcastMatmul) {
  SKIP_WITHOUT_AMX();
  struct Case {
    Shape a, b;
  };
  for (const Case& c :
       {Case{{2, 3, 33, 40}, {2, 3, 40, 17}}, Case{{2, 1, 7, 64}, {1, 4, 64, 32}},
        Case{{3, 16, 8}, {8, 96}}, Case{{5, 1, 72}, {5, 72, 1}}, Case{{4, 100, 64}, {1, 64, 33}}}) {
    SCOPED_TRACE(shape_str(c.a) + " @ " + shape_str(c.b));
    const Tensor a = random_bf16(c.a, 21), b = random_bf16(c.b, 22);
    const Tensor y = matmul(a, b);
    const Tensor ref = on_onednn([&] { return matmul(a, b); });
    ASSERT_EQ(y.shape(), ref.shape());
    EXPECT_TRUE(test::bf16_close(y, ref, 0.0));
  }
  // 1-D operands (promoted and squeezed) and q @ k^T per head.
  const Tensor v = random_bf16({40}, 23), m = random_bf16({40, 9}, 24);
  EXPECT_TRUE(test::bf16_close(matmul(v, m), on_onednn([&] { return matmul(v, m); }), 0.0));
  const Tensor q = random_bf16({1, 2, 24, 64}, 25), k = random_bf16({1, 2, 40, 64}, 26);
  const Tensor s = matmul(q, k.transpose(-1, -2));
  EXPECT_TRUE(test::bf16_close(s, on_onednn([&] { return matmul(q, k.transpose(-1, -2)); }), 0.0));
}

TEST(GemmAmx, WeightIsPackedOnceAndDiesWithItsStorage) {
  SKIP_WITHOUT_AMX();
  clear_kernel_caches();
  const Tensor x = random_bf16({40, 64}, 31);
  {
    const Tensor w = random_bf16({48, 64}, 32);
    const Tensor y1 = linear(x, w);
    const KernelCacheStats s1 = kernel_cache_stats();
    const Tensor y2 = linear(x, w);
    const KernelCacheStats s2 = kernel_cache_stats();
    EXPECT_EQ(s2.packed_misses, s1.packed_misses) << "weight was packed twice";
    EXPECT_EQ(s2.packed_hits, s1.packed_hits + 1);
    EXPECT_EQ(s2.packed_entries, 1);
    EXPECT_EQ(s2.packed_bytes, amx_gemm::packed_b_elems(64, 48) * 2);
    EXPECT_TRUE(test::bit_equal(y1, y2));
  }
  // New weights of the same shape (maybe at the freed address) are never served stale tiles.
  for (int round = 1; round <= 4; ++round) {
    const Tensor w =
        Tensor::from_floats(std::vector<float>(48 * 64, float(round)), {48, 64}, DType::bf16);
    const Tensor ones =
        Tensor::from_floats(std::vector<float>(40 * 64, 1.0f), {40, 64}, DType::bf16);
    EXPECT_FLOAT_EQ(linear(ones, w).to_floats()[5], 64.0f * float(round)) << "round " << round;
  }
  set_packed_weight_cache_capacity(0);
  const Tensor w = random_bf16({48, 64}, 33);
  EXPECT_TRUE(test::bf16_close(linear(x, w), on_onednn([&] { return linear(x, w); }), 0.0));
  set_packed_weight_cache_capacity(size_t(4) << 30);
  clear_kernel_caches();
  EXPECT_EQ(kernel_cache_stats().packed_entries, 0);
}

TEST(GemmAmx, SpecialValuesRoundLikeTorch) {
  SKIP_WITHOUT_AMX();
  // Products that overflow bf16's range give inf; a NaN input stays NaN in its row.
  Tensor x = Tensor::from_floats(std::vector<float>(2 * 32, 1e30f), {2, 32}, DType::bf16);
  const Tensor w = Tensor::from_floats(std::vector<float>(3 * 32, 1e10f), {3, 32}, DType::bf16);
  auto y = linear(x, w).to_floats();
  EXPECT_TRUE(std::isinf(y[0]) && y[0] > 0);
  std::vector<float> xv(2 * 32, 0.5f);
  xv[3] = NAN;
  x = Tensor::from_floats(xv, {2, 32}, DType::bf16);
  y = linear(x, w).to_floats();
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[2]));
  EXPECT_EQ(y[3], round_bf16(16.0f * round_bf16(1e10f)));
}

}  // namespace
}  // namespace tessera
