// SDPA against torch.nn.functional.scaled_dot_product_attention goldens
// (reference/goldens/ops_attention.py), on the CPU paths: amx (our AMX tile kernels: bf16, and f32
// through split bf16 products; fall back to tiled elsewhere), tiled (oneDNN tile GEMMs + online
// softmax) and reference (plain loops).
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "backends/cpu/attention/attention_kernels.h"
#include "ops/copy.h"
#include "runtime/cpu_features.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using cpu::AttentionPath;

// f32: outputs are convex combinations of v ~ N(0, 1) rows; summation order differs from torch
// (tile sizes, oneDNN's blocking), which moves results by a few float ulps of the *inputs*
// (~1e-7 absolute per term). Entries that land near zero then fail a pure 1e-5 relative test,
// hence atol 1e-6. 5e-6 on the 1000-key case (more terms) and on the T5-style case with scale
// 1.0, whose logits reach ~30: one fp32 ulp of such a logit (2e-6) is already a 2e-6 relative
// change of its weight, and torch's own logits carry several.
constexpr double kRtol = 1e-5;

// bf16: the issue's bar is 1 bf16 ulp or 1e-2 relative. Attention adds one more source of
// difference that no kernel can avoid without reproducing torch's GEMM summation order: each
// probability is rounded to bf16 before the P.V product (as torch does), and a score that differs
// in its last fp32 bit can flip that rounding, which moves an output by up to 2^-8 * |v| / sum.
// Outputs near zero (cancellation) then miss by more than an ulp while being off by < 2^-8
// absolute; allow exactly that, and require that at most 10% of elements need it (long
// sequences average more values, so more outputs sit near zero: 3% at L = 1000).
::testing::AssertionResult attention_bf16_close(const Tensor& actual, const Tensor& expected) {
  if (test::bf16_close(actual, expected)) return ::testing::AssertionSuccess();
  const auto a = actual.to_floats(), e = expected.to_floats();
  size_t beyond_ulp = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float diff = std::fabs(a[i] - e[i]);
    const int ulp = std::abs(int(int16_t(f32_to_bf16(a[i]))) - int(int16_t(f32_to_bf16(e[i]))));
    if (ulp <= 1 || diff <= 1e-2f * std::fabs(e[i])) continue;
    ++beyond_ulp;
    if (diff > 1.f / 256)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs expected "
                                           << e[i] << " (beyond 2^-8 absolute)";
  }
  if (beyond_ulp * 10 > a.size())
    return ::testing::AssertionFailure()
           << beyond_ulp << " of " << a.size() << " elements beyond 1 ulp (more than 10%)";
  return ::testing::AssertionSuccess();
}

struct PathGuard {
  explicit PathGuard(AttentionPath p) { cpu::set_attention_path(p); }
  ~PathGuard() { cpu::set_attention_path(AttentionPath::automatic); }
};

struct Case {
  const char* name;
  bool causal;
};

class SdpaGolden : public ::testing::TestWithParam<std::tuple<Case, AttentionPath>> {};

TEST_P(SdpaGolden, MatchesTorch) {
  const auto [c, path] = GetParam();
  const std::string file = std::string("ops/attention/sdpa_") + c.name + ".safetensors";
  if (!test::has_fixture(file)) GTEST_SKIP() << "missing fixture " << file;
  auto t = test::load_fixture(file);
  PathGuard guard(path);
  SdpaOptions o;
  o.causal = c.causal;
  if (t.count("bias")) {
    o.mask = t["bias"];
    o.scale = 1.0;
  }
  if (t.count("mask")) o.mask = t["mask"];
  const Tensor out = scaled_dot_product_attention(t["q"], t["k"], t["v"], o);
  const Tensor& expected = t["out"];
  ASSERT_EQ(out.dtype(), expected.dtype());
  if (out.dtype() == DType::bf16) {
    EXPECT_TRUE(attention_bf16_close(out, expected));
  } else {
    const double atol = t["k"].dim(2) >= 1000 || t.count("bias") ? 5e-6 : 1e-6;
    EXPECT_TRUE(test::all_close(out, expected, kRtol, atol));
  }
}

const Case kCases[] = {
    {"f32_d64_l77", false},         {"f32_d128_l1", false},     {"f32_d128_q1_k50", false},
    {"f32_d64_l1000", false},       {"f32_causal_l77", true},   {"f32_causal_q33_k77", true},
    {"f32_gqa_causal", true},       {"f32_bias_scale1", false}, {"f32_boolmask_causal", true},
    {"bf16_d128_l77", false},       {"bf16_d64_l1", false},     {"bf16_d128_l1000", false},
    {"bf16_causal_l77", true},      {"bf16_gqa_causal", true},  {"bf16_bias_scale1", false},
    {"bf16_boolmask_causal", true},
};

INSTANTIATE_TEST_SUITE_P(Fixtures, SdpaGolden,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(AttentionPath::tiled,
                                                              AttentionPath::reference,
                                                              AttentionPath::amx)),
                         [](const auto& info) {
                           const AttentionPath p = std::get<1>(info.param);
                           return std::string(std::get<0>(info.param).name) +
                                  (p == AttentionPath::tiled       ? "_tiled"
                                   : p == AttentionPath::reference ? "_reference"
                                                                   : "_amx");
                         });

Tensor random_tensor(const Shape& shape, DType dt, uint32_t seed) {
  std::vector<float> v(size_t(shape_numel(shape)));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(int32_t(s >> 8) % 2001 - 1000) / 400.f;
  }
  return Tensor::from_floats(v, shape, dt);
}

// Views as diffusers produces them: (B, L, H, D) transposed to (B, H, L, D), read in place.
TEST(Sdpa, StridedInputsMatchContiguous) {
  auto t = test::load_fixture("ops/attention/sdpa_f32_d64_l77.safetensors");
  const Tensor qs = clone(t["q"].transpose(1, 2)).transpose(1, 2);
  const Tensor ks = clone(t["k"].transpose(1, 2)).transpose(1, 2);
  ASSERT_FALSE(qs.is_contiguous());
  const Tensor out = scaled_dot_product_attention(qs, ks, t["v"]);
  EXPECT_TRUE(test::all_close(out, t["out"], kRtol, 1e-6));
}

// Tiles with tails on both axes, causal + GQA + additive mask: tiled against reference.
TEST(Sdpa, TiledMatchesReferenceOnLongMaskedInput) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor q = random_tensor({1, 4, 600, 64}, dt, 1);
    const Tensor k = random_tensor({1, 2, 1100, 64}, dt, 2);
    const Tensor v = random_tensor({1, 2, 1100, 64}, dt, 3);
    const Tensor bias = random_tensor({1, 1, 600, 1100}, DType::f32, 4);
    SdpaOptions o;
    o.causal = true;
    o.mask = bias;
    Tensor tiled, ref;
    {
      PathGuard g(AttentionPath::tiled);
      tiled = scaled_dot_product_attention(q, k, v, o);
    }
    {
      PathGuard g(AttentionPath::reference);
      ref = scaled_dot_product_attention(q, k, v, o);
    }
    if (dt == DType::bf16)
      EXPECT_TRUE(attention_bf16_close(tiled, ref));
    else
      EXPECT_TRUE(test::all_close(tiled, ref, kRtol, 5e-6));
  }
}

// The AMX kernel against the reference on sizes that leave tails everywhere: L not a multiple of
// 16/32, key blocks of 512 plus a remainder, head dims 64/128, causal, GQA, masks, strided views.
struct AmxCase {
  int64_t B, H, Hkv, Lq, Lk, D;
  bool causal;
  int mask;  // 0 none, 1 additive (B, 1, Lq, Lk), 2 bool (Lq, Lk) with a fully masked row
  bool strided;
};

Tensor sdpa_on(AttentionPath p, const Tensor& q, const Tensor& k, const Tensor& v,
               const SdpaOptions& o) {
  PathGuard g(p);
  return scaled_dot_product_attention(q, k, v, o);
}

class SdpaAmx : public ::testing::TestWithParam<AmxCase> {};

TEST_P(SdpaAmx, MatchesReference) {
  if (cpu_isa() < CpuIsa::amx_bf16) GTEST_SKIP() << "no AMX on this CPU (or TESSERA_CPU_ISA)";
  const AmxCase c = GetParam();
  Tensor q = random_tensor({c.B, c.H, c.Lq, c.D}, DType::bf16, 11);
  Tensor k = random_tensor({c.B, c.Hkv, c.Lk, c.D}, DType::bf16, 12);
  Tensor v = random_tensor({c.B, c.Hkv, c.Lk, c.D}, DType::bf16, 13);
  if (c.strided) {  // (B, L, H, D) storage read through a transpose, as diffusers passes it
    q = clone(q.transpose(1, 2)).transpose(1, 2);
    k = clone(k.transpose(1, 2)).transpose(1, 2);
    v = clone(v.transpose(1, 2)).transpose(1, 2);
  }
  SdpaOptions o;
  o.causal = c.causal;
  if (c.mask == 1) o.mask = random_tensor({c.B, 1, c.Lq, c.Lk}, DType::f32, 14);
  if (c.mask == 2) {
    std::vector<int64_t> m(size_t(c.Lq * c.Lk));
    for (size_t i = 0; i < m.size(); ++i) m[i] = (i * 7) % 5 != 0;
    for (int64_t j = 0; j < c.Lk; ++j) m[size_t(c.Lq / 2 * c.Lk + j)] = 0;
    o.mask = Tensor::from_ints(m, {c.Lq, c.Lk}, DType::boolean);
  }
  const Tensor amx = sdpa_on(AttentionPath::amx, q, k, v, o);
  const Tensor ref = sdpa_on(AttentionPath::reference, q, k, v, o);
  EXPECT_TRUE(attention_bf16_close(amx, ref));
  // The default path is this kernel for bf16 on AMX, bit for bit.
  EXPECT_EQ(sdpa_on(AttentionPath::automatic, q, k, v, o).to_floats(), amx.to_floats());
  if (c.mask == 2) {
    const auto out = amx.to_floats();
    for (int64_t d = 0; d < c.D; ++d) EXPECT_EQ(out[size_t(c.Lq / 2 * c.D + d)], 0.f);
  }
}

INSTANTIATE_TEST_SUITE_P(OddSizes, SdpaAmx,
                         ::testing::Values(AmxCase{1, 2, 2, 77, 77, 64, false, 0, false},
                                           AmxCase{1, 3, 3, 45, 600, 128, false, 0, false},
                                           AmxCase{2, 4, 2, 130, 130, 128, true, 0, false},
                                           AmxCase{1, 4, 1, 300, 1100, 64, true, 1, false},
                                           AmxCase{1, 2, 2, 1, 50, 128, false, 0, false},
                                           AmxCase{1, 2, 2, 33, 17, 64, false, 2, false},
                                           AmxCase{1, 2, 2, 70, 530, 128, true, 2, true},
                                           AmxCase{1, 3, 3, 257, 1030, 128, false, 0, true},
                                           AmxCase{1, 2, 1, 600, 200, 64, true, 0, false}));

// ---- f32 on AMX (split bf16 products) against a double-precision reference ---------------------

// softmax(q k^T * scale + mask) v in double, one row at a time; mask as SdpaAmx builds it.
std::vector<double> sdpa_double(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                const Tensor* mask) {
  const int64_t B = q.dim(0), H = q.dim(1), Lq = q.dim(2), D = q.dim(3), Hkv = k.dim(1),
                Lk = k.dim(2), Dv = v.dim(3);
  const auto qf = q.to_floats(), kf = k.to_floats(), vf = v.to_floats();
  std::vector<float> mf;
  if (mask) {
    const Tensor m4 = mask->ndim() == 4 ? *mask : mask->reshape({1, 1, Lq, Lk});
    mf = m4.expand({B, H, Lq, Lk}).to_floats();
  }
  const bool bool_mask = mask && mask->dtype() == DType::boolean;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> out(size_t(B * H * Lq * Dv), 0.0), s(static_cast<size_t>(Lk), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t hk = h / (H / Hkv);
        const float* qr = &qf[size_t(((b * H + h) * Lq + i) * D)];
        double mx = -INFINITY;
        for (int64_t j = 0; j < Lk; ++j) {
          const float* kr = &kf[size_t(((b * Hkv + hk) * Lk + j) * D)];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qr[d]) * double(kr[d]);
          double x = dot * scale;
          if (mask) {
            const float mv = mf[size_t(((b * H + h) * Lq + i) * Lk + j)];
            x = bool_mask ? (mv != 0 ? x : -INFINITY) : x + double(mv);
          }
          if (causal && j > i) x = -INFINITY;
          s[size_t(j)] = x;
          mx = std::max(mx, x);
        }
        double* o = &out[size_t(((b * H + h) * Lq + i) * Dv)];
        if (mx == -INFINITY) continue;  // fully masked: 0
        double sum = 0;
        for (int64_t j = 0; j < Lk; ++j) {
          if (s[size_t(j)] == -INFINITY) continue;
          const double p = std::exp(s[size_t(j)] - mx);
          sum += p;
          const float* vr = &vf[size_t(((b * Hkv + hk) * Lk + j) * Dv)];
          for (int64_t d = 0; d < Dv; ++d) o[d] += p * double(vr[d]);
        }
        for (int64_t d = 0; d < Dv; ++d) o[d] /= sum;
      }
  return out;
}

// max |out - ref| / max |ref|: the issue's f32 bound (1e-5) as a whole-tensor relative error.
double rel_error(const Tensor& out, const std::vector<double>& ref) {
  const auto o = out.to_floats();
  double err = 0, mag = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    err = std::max(err, std::fabs(double(o[i]) - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  return mag > 0 ? err / mag : err;
}

struct ProductsGuard {
  ProductsGuard(int qk, int pv) { cpu::set_sdpa_f32_products(qk, pv); }
  ~ProductsGuard() { cpu::set_sdpa_f32_products(0, 0); }
};

Tensor scaled(const Tensor& t, float f) {
  auto v = t.to_floats();
  for (auto& x : v) x *= f;
  return Tensor::from_floats(v, t.shape(), t.dtype());
}

class SdpaAmxF32 : public ::testing::TestWithParam<AmxCase> {};

// Odd sizes, causal, GQA, masks and strided views, as SdpaAmx covers them for bf16.
TEST_P(SdpaAmxF32, MatchesDoubleReference) {
  if (cpu_isa() < CpuIsa::amx_bf16) GTEST_SKIP() << "no AMX on this CPU (or TESSERA_CPU_ISA)";
  const AmxCase c = GetParam();
  Tensor q = random_tensor({c.B, c.H, c.Lq, c.D}, DType::f32, 21);
  Tensor k = random_tensor({c.B, c.Hkv, c.Lk, c.D}, DType::f32, 22);
  Tensor v = random_tensor({c.B, c.Hkv, c.Lk, c.D}, DType::f32, 23);
  if (c.strided) {
    q = clone(q.transpose(1, 2)).transpose(1, 2);
    k = clone(k.transpose(1, 2)).transpose(1, 2);
    v = clone(v.transpose(1, 2)).transpose(1, 2);
  }
  SdpaOptions o;
  o.causal = c.causal;
  if (c.mask == 1) o.mask = random_tensor({c.B, 1, c.Lq, c.Lk}, DType::f32, 24);
  if (c.mask == 2) {
    std::vector<int64_t> m(size_t(c.Lq * c.Lk));
    for (size_t i = 0; i < m.size(); ++i) m[i] = (i * 7) % 5 != 0;
    for (int64_t j = 0; j < c.Lk; ++j) m[size_t(c.Lq / 2 * c.Lk + j)] = 0;
    o.mask = Tensor::from_ints(m, {c.Lq, c.Lk}, DType::boolean);
  }
  const auto ref = sdpa_double(q, k, v, c.causal, o.mask.defined() ? &o.mask : nullptr);
  const Tensor amx = sdpa_on(AttentionPath::amx, q, k, v, o);
  const double err = rel_error(amx, ref);
  EXPECT_LE(err, 1e-5);
  // No worse than the oneDNN f32 tiles it replaces (these scores reach ~15, where both are off by
  // more than the goldens' atol; the goldens check the elementwise contract).
  const double tiled_err = rel_error(sdpa_on(AttentionPath::tiled, q, k, v, o), ref);
  EXPECT_LE(err, std::max(2 * tiled_err, 1e-6)) << "oneDNN f32 tiles: " << tiled_err;
  EXPECT_EQ(sdpa_on(AttentionPath::automatic, q, k, v, o).to_floats(), amx.to_floats());
  if (c.mask == 2) {
    const auto out = amx.to_floats();
    for (int64_t d = 0; d < c.D; ++d) EXPECT_EQ(out[size_t(c.Lq / 2 * c.D + d)], 0.f);
  }
}

INSTANTIATE_TEST_SUITE_P(OddSizes, SdpaAmxF32,
                         ::testing::Values(AmxCase{1, 2, 2, 77, 77, 64, false, 0, false},
                                           AmxCase{1, 3, 3, 45, 600, 128, false, 0, false},
                                           AmxCase{2, 4, 2, 130, 130, 128, true, 0, false},
                                           AmxCase{1, 4, 1, 300, 1100, 64, true, 1, false},
                                           AmxCase{1, 2, 2, 1, 50, 128, false, 0, false},
                                           AmxCase{1, 2, 2, 33, 17, 64, false, 2, false},
                                           AmxCase{1, 2, 2, 70, 530, 128, true, 2, true},
                                           AmxCase{1, 3, 3, 257, 1030, 128, false, 0, true},
                                           AmxCase{1, 2, 1, 600, 200, 64, true, 0, false}));

// Head dim 128 (FLUX) with large scores: q, k uniform in [-2.5, 2.5] give scores of standard
// deviation ~2 (x2: ~4, peaks past 15), where the split products' error in a score shows most in
// the probabilities. Reports the measured error of each product count; the default must hold
// the issue's 1e-5.
TEST(Sdpa, AmxF32LargeScoresWithinIssueTolerance) {
  if (cpu_isa() < CpuIsa::amx_bf16) GTEST_SKIP() << "no AMX on this CPU (or TESSERA_CPU_ISA)";
  for (float qscale : {1.f, 2.f}) {
    const Tensor q = scaled(random_tensor({1, 2, 300, 128}, DType::f32, 31), qscale);
    const Tensor k = random_tensor({1, 2, 1100, 128}, DType::f32, 32);
    const Tensor v = random_tensor({1, 2, 1100, 128}, DType::f32, 33);
    const auto ref = sdpa_double(q, k, v, false, nullptr);
    for (auto [qk, pv] : {std::pair{3, 3}, {4, 4}, {6, 6}, {6, 3}, {6, 4}}) {
      ProductsGuard g(qk, pv);
      const double err = rel_error(sdpa_on(AttentionPath::amx, q, k, v, {}), ref);
      std::printf("[ f32 AMX ] q x%.0f, %d+%d products: max|err| / max|ref| = %.3g\n", qscale, qk,
                  pv, err);
      if (qk == 6 && pv == 6) EXPECT_LE(err, 1e-5) << qk << "+" << pv << " products";
    }
    // The default (6 for Q K^T and for P V).
    EXPECT_LE(rel_error(sdpa_on(AttentionPath::amx, q, k, v, {}), ref), 1e-5);
    {
      PathGuard tg(AttentionPath::tiled);
      std::printf("[ f32 AMX ] q x%.0f, oneDNN f32 tiles: max|err| / max|ref| = %.3g\n", qscale,
                  rel_error(scaled_dot_product_attention(q, k, v), ref));
    }
  }
}

TEST(Sdpa, FullyMaskedRowsGiveZero) {
  const Tensor q = random_tensor({1, 1, 3, 16}, DType::f32, 5);
  const Tensor k = random_tensor({1, 1, 4, 16}, DType::f32, 6);
  const Tensor v = random_tensor({1, 1, 4, 16}, DType::f32, 7);
  std::vector<int64_t> m(12, 1);
  for (int j = 0; j < 4; ++j) m[4 + j] = 0;  // row 1 sees nothing
  SdpaOptions o;
  o.mask = Tensor::from_ints(m, {3, 4}, DType::boolean);
  for (AttentionPath p : {AttentionPath::tiled, AttentionPath::reference, AttentionPath::amx}) {
    PathGuard g(p);
    const auto out = scaled_dot_product_attention(q, k, v, o).to_floats();
    for (int d = 0; d < 16; ++d) EXPECT_EQ(out[16 + d], 0.f);
    EXPECT_NE(out[0], 0.f);
  }
}

TEST(SdpaTiles, KeyTransposeMatchesThePlainLoop) {
  // The register-block transposes (16 x 16 on AVX-512, 8 x 8 on AVX2) and their edges, on shapes
  // with and without whole blocks, against dst[c][r] = src[r][c].
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa() < isa) continue;
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(8), int64_t(16), int64_t(37), int64_t(80)})
      for (int64_t cols : {int64_t(3), int64_t(8), int64_t(16), int64_t(24), int64_t(128)}) {
        const int64_t lds = cols + 5, ldd = rows + 3;
        std::vector<float> src(size_t(rows * lds)), dst(size_t(cols * ldd), -1.f);
        for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
        if (isa == CpuIsa::avx2)
          cpu::transpose_f32_avx2(src.data(), lds, rows, cols, dst.data(), ldd);
        else
          cpu::transpose_f32_avx512(src.data(), lds, rows, cols, dst.data(), ldd);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(dst[size_t(c * ldd + r)], src[size_t(r * lds + c)])
                << cpu_isa_name(isa) << " " << rows << "x" << cols << " at " << r << "," << c;
        for (int64_t c = 0; c < cols; ++c)  // past each destination row: untouched
          for (int64_t r = rows; r < ldd; ++r) ASSERT_EQ(dst[size_t(c * ldd + r)], -1.f);
      }
  }
}

// Error terms of the softmax rows' f32 arithmetic (docs/decisions/0018-isa-kernel-guarantees.md):
// the unit roundoff, and the relative error of each exp where its result is at least 2^-125:
// exp_u20 at most 3.87e-7 (4.7 ulp; measured on every float from ln(FLT_MIN) to 1e-3, the
// largest near -86 from ln 2's rounding), libm's expf 1 ulp (glibc's documented bound).
constexpr double kU = 0x1p-24;
constexpr double kExpU20Rel = 4e-7;
constexpr double kExpfRel = 0x1p-23;

// Worst-case relative error of a sum of nonnegative terms when each term passes through at most k
// roundings (whatever the order): gamma_k = k u / (1 - k u).
double gamma_sum(int64_t k) {
  return double(k) * kU / (1 - double(k) * kU);
}

// The vector row kernels against the scalar row on two key blocks of one row (the second
// rescales). The AVX2 row is built without FMA contraction: P and m are the scalar row's bits.
// The AVX-512 rows are built with it: x * scale - m is one FMA where the scalar row rounds the
// product first, and with a mask so is x * scale + add. exp's argument d then moves by up to
// u (|x * scale| + 2 |d|), plus u 2|x| and the max's own move with a mask, and P by that
// (relative) plus each exp's error; m is the scalar row's unless there is a mask. Bounds are
// twice the first-order terms. Each row sums in its own order (the scalar row one chain of n
// adds; the vector rows 16 lanes, a 4-level tree and the tail), so each l is checked against the
// exact sum of its own terms and against the other's l with both orders' worst cases.
TEST(SoftmaxRow, VectorKernelsMatchTheScalarRow) {
  struct Kernel {
    const char* name;
    cpu::SoftmaxRowFn fn;
    CpuIsa needs;
    bool exact;  // built with -ffp-contract=off: the scalar row's roundings
  };
  const Kernel kernels[] = {
      {"avx2", cpu::softmax_row_avx2, CpuIsa::avx2, true},
      {"avx512", cpu::softmax_row_avx512, CpuIsa::avx512, false},
      {"avx512bf16", cpu::softmax_row_avx512bf16, CpuIsa::avx512_bf16, false}};
  const float scale = 0.35f;
  int checked = 0;
  for (const Kernel& k : kernels) {
    if (cpu_isa() < k.needs) continue;
    for (int64_t n : {5, 16, 33, 320, 512})
      for (int64_t cut : {0, 3, 17})
        for (bool masked : {false, true})
          for (bool p_bf16 : {false, true})
            for (bool flush : {false, true}) {  // every third score far below: exp flushed to 0
              const int64_t nvalid = std::max<int64_t>(0, n - cut), vec_end = n - n % 16;
              const std::string what = std::string(k.name) + " n " + std::to_string(n) +
                                       " nvalid " + std::to_string(nvalid) +
                                       (masked ? " masked" : "") + (p_bf16 ? " bf16 P" : "") +
                                       (flush ? " flush" : "");
              // Roundings each term of l passes through: scalar n adds; vector rows a lane's
              // adds, the tree and the tail's add, or the tail's adds; both then l * alpha + sum.
              const int64_t depth_s = n + 2,
                            depth_v = std::max(vec_end / 16 + 5, n % 16 + 1) + 2;
              float ms = -std::numeric_limits<float>::infinity(), ls = 0, mv = ms, lv = 0;
              double dm = 0;    // bound on |mv - ms|
              double lrel = 0;  // bound on |lv / ls - 1|
              for (int block = 0; block < 2; ++block) {
                const auto raw =
                    random_tensor({n}, DType::f32, uint64_t(7 * n + block)).to_floats();
                std::vector<float> add(static_cast<size_t>(n));
                for (int64_t j = 0; j < n; ++j) add[size_t(j)] = j % 5 == 0 ? -3.f : 0.25f;
                std::vector<float> s1 = raw, s2 = raw;
                for (float& x : s1) x *= 4.f;  // scores up to ~16 before scaling
                // Not near ln(FLT_MIN), where the scalar row's two roundings of p * 2^n differ.
                if (flush)
                  for (size_t j = 0; j < s1.size(); j += 3) s1[j] = -1e4f;
                s2 = s1;
                const std::vector<float> s0 = s1;
                const float ms_old = ms, ls_old = ls, lv_old = lv;
                std::vector<float> p1(static_cast<size_t>(n)), p2(static_cast<size_t>(n));
                const float a1 = cpu::softmax_row_scalar(s1.data(), n, nvalid, scale,
                                                         masked ? add.data() : nullptr, &ms, &ls,
                                                         p1.data(), p_bf16);
                const float a2 = k.fn(s2.data(), n, nvalid, scale, masked ? add.data() : nullptr,
                                      &mv, &lv, p2.data(), p_bf16);
                // s1 now holds the scalar row's x = s * scale (+ add); y = s * scale unrounded.
                auto y_abs = [&](int64_t j) { return std::fabs(double(s0[size_t(j)]) * scale); };
                auto x_abs = [&](int64_t j) { return std::fabs(double(s1[size_t(j)])); };
                // |x_v - x_s|: the product rounded or not, and with a mask the sum rounded apart.
                auto dx = [&](int64_t j) {
                  return kU * (y_abs(j) + (masked && !k.exact ? 2 * x_abs(j) : 0.0));
                };
                // m, and alpha = exp(m_old - m).
                const double dm_old = dm;
                double alpha_rel = 0;
                if (k.exact || !masked) {  // max(s) * scale is max(s * scale): rounding is monotonic
                  ASSERT_EQ(ms, mv) << what;
                  ASSERT_EQ(a1, a2) << what;
                } else {
                  // |max x_s - max x_v| is at most |x_s - x_v| at the argmax of either (s2 holds
                  // x_v where there is a mask).
                  int64_t js = 0, jv = 0;
                  for (int64_t j = 1; j < nvalid; ++j) {
                    if (s1[size_t(j)] > s1[size_t(js)]) js = j;
                    if (s2[size_t(j)] > s2[size_t(jv)]) jv = j;
                  }
                  if (nvalid > 0) dm = std::max({dm, 2 * dx(js), 2 * dx(jv)});
                  if (std::isinf(ms))  // nothing visible yet
                    ASSERT_EQ(ms, mv) << what;
                  else
                    ASSERT_LE(std::fabs(double(mv) - ms), dm) << what << " block " << block;
                  if (ms_old == -std::numeric_limits<float>::infinity()) {
                    ASSERT_EQ(a1, a2) << what;  // exp(-inf) = 0, or 1 with nothing visible
                  } else {
                    alpha_rel =
                        2 * (dm_old + dm + 2 * kU * std::fabs(double(ms_old) - ms) + 2 * kExpfRel);
                    ASSERT_NEAR(a2, a1, alpha_rel * a1) << what << " block " << block;
                  }
                }
                // P: f32 within the bound above; bf16 within one bf16 ulp (at most 2^-7 of the
                // value), since the f32 values differ by far less than half of one.
                double p_rel_max = 0;
                if (k.exact) {
                  ASSERT_EQ(std::memcmp(p1.data(), p2.data(), size_t(n) * (p_bf16 ? 2 : 4)), 0)
                      << what << " block " << block;
                } else {
                  for (int64_t j = 0; j < n; ++j) {
                    double rel = 0;
                    if (j < nvalid) {
                      const double d = std::fabs(double(s1[size_t(j)]) - ms);
                      rel = 2 * (dx(j) + dm + 2 * kU * d +
                                 2 * (j < vec_end ? kExpU20Rel : kExpfRel));
                    }
                    p_rel_max = std::max(p_rel_max, rel);
                    const float x1 = p_bf16
                                         ? bf16_to_f32(reinterpret_cast<uint16_t*>(p1.data())[j])
                                         : p1[size_t(j)];
                    const float x2 = p_bf16
                                         ? bf16_to_f32(reinterpret_cast<uint16_t*>(p2.data())[j])
                                         : p2[size_t(j)];
                    ASSERT_NEAR(x2, x1, (p_bf16 ? 0x1p-7 : rel) * x1) << what << " column " << j;
                  }
                }
                // l: each against the exact sum of its own terms (f32 P holds them), and the two
                // against each other (the other block's difference carried through alpha).
                if (!p_bf16) {
                  double Ls = double(ls_old) * a1, Lv = double(lv_old) * a2;
                  for (int64_t j = 0; j < n; ++j) Ls += p1[size_t(j)], Lv += p2[size_t(j)];
                  ASSERT_LE(std::fabs(ls - Ls), gamma_sum(depth_s) * Ls) << what << " scalar l";
                  ASSERT_LE(std::fabs(lv - Lv), gamma_sum(depth_v) * Lv) << what << " block " << block;
                }
                // (x 1.01: the second-order terms)
                lrel = 1.01 * (gamma_sum(depth_s) + gamma_sum(depth_v) +
                               std::max(lrel + alpha_rel, p_rel_max));
                ASSERT_NEAR(lv, ls, lrel * ls) << what << " block " << block;
              }
              ++checked;
            }
  }
  if (checked == 0) GTEST_SKIP() << "no vector row kernel on this CPU";
}

TEST(Sdpa, RejectsBadShapes) {
  const Tensor q = Tensor::zeros({1, 3, 4, 8}, DType::f32);
  const Tensor k = Tensor::zeros({1, 2, 4, 8}, DType::f32);
  EXPECT_THROW(scaled_dot_product_attention(q, k, k), Error);  // 3 heads vs 2 kv heads
  const Tensor kb = Tensor::zeros({1, 3, 4, 8}, DType::bf16);
  EXPECT_THROW(scaled_dot_product_attention(q, kb, kb), Error);  // mixed dtypes
  SdpaOptions o;
  o.mask = Tensor::zeros({2, 4}, DType::f32);
  const Tensor k3 = Tensor::zeros({1, 3, 4, 8}, DType::f32);
  EXPECT_THROW(scaled_dot_product_attention(q, k3, k3, o), Error);  // mask does not broadcast
}

}  // namespace
}  // namespace tessera
