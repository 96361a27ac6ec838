// Elementwise ops against PyTorch goldens (reference/goldens/ops_elementwise.py), the per-ISA
// row kernels against each other, and shape/dtype errors.
#include "ops/elementwise.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "backends/cpu/elementwise/elementwise_kernels.h"
#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::all_close;
using test::bf16_close;

const char* kBinary = "ops/elementwise/binary.safetensors";
const char* kUnary = "ops/elementwise/unary.safetensors";

// bf16: one bf16 ulp, or 1e-2 relative, or |diff| <= atol. The atol is for GELU tails, where
// torch's own result is quantised by 1 + erf / 1 + tanh in fp32 (steps of ~1e-7 absolute).
::testing::AssertionResult bf16_near(const Tensor& a, const Tensor& e, double atol) {
  if (a.shape() != e.shape()) return bf16_close(a, e);
  const auto av = a.to_floats(), ev = e.to_floats();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    const int ulp = std::abs(int(int16_t(f32_to_bf16(av[i]))) - int(int16_t(f32_to_bf16(ev[i]))));
    const double d = std::fabs(double(av[i]) - double(ev[i]));
    const bool ok = ulp <= 1 || d <= 1e-2 * std::fabs(ev[i]) || d <= atol ||
                    (std::isnan(av[i]) && std::isnan(ev[i]));
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << av.size() << " beyond 1 ulp / 1e-2 / " << atol << "; first at "
         << first << ": " << av[first] << " vs expected " << ev[first];
}

// f32: rtol 1e-5 with a tiny atol for values near 0; bf16: one bf16 ulp or 1e-2 relative.
::testing::AssertionResult matches(const Tensor& a, const Tensor& e, double atol = 1e-6,
                                   double bf16_atol = 0) {
  if (a.dtype() != e.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(a.dtype()) << " != expected " << dtype_name(e.dtype());
  if (e.dtype() == DType::bf16)
    return bf16_atol > 0 ? bf16_near(a, e, bf16_atol) : bf16_close(a, e);
  return all_close(a, e, 1e-5, atol);
}

TEST(Elementwise, BinaryBroadcastMatchesTorch) {
  if (!test::has_fixture(kBinary)) GTEST_SKIP() << "missing fixture " << kBinary;
  auto f = test::load_fixture(kBinary);
  const std::pair<const char*, BinaryOp> ops[] = {
      {"add", BinaryOp::add}, {"sub", BinaryOp::sub},         {"mul", BinaryOp::mul},
      {"div", BinaryOp::div}, {"maximum", BinaryOp::maximum}, {"minimum", BinaryOp::minimum}};
  for (const char* dn : {"f32", "bf16"}) {
    const Tensor a = f.at(std::string("a_") + dn);
    for (const char* cn : {"same", "row", "col", "mid", "lead"}) {
      const Tensor b = f.at(std::string("b_") + cn + "_" + dn);
      for (const auto& [on, op] : ops) {
        const std::string key = std::string(on) + "_" + cn + "_" + dn;
        EXPECT_TRUE(matches(binary(op, a, b), f.at(key))) << key;
      }
      const std::string key = std::string("pow_") + cn + "_" + dn;
      EXPECT_TRUE(matches(pow(abs(a) + 0.5, b * 0.5), f.at(key))) << key;
    }
  }
}

TEST(Elementwise, ScalarOperandsKeepTensorDtype) {
  if (!test::has_fixture(kBinary)) GTEST_SKIP() << "missing fixture " << kBinary;
  auto f = test::load_fixture(kBinary);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor a = f.at("a_" + dn);
    const Tensor pos = abs(a) + 0.5;
    EXPECT_TRUE(matches(a + 0.1, f.at("add_s_" + dn))) << dn;
    EXPECT_TRUE(matches(a - 0.7, f.at("sub_s_" + dn))) << dn;
    EXPECT_TRUE(matches(a * 0.3, f.at("mul_s_" + dn))) << dn;
    EXPECT_TRUE(matches(a / 3.0, f.at("div_s_" + dn))) << dn;
    EXPECT_TRUE(matches(0.1 - a, f.at("rsub_s_" + dn))) << dn;
    EXPECT_TRUE(matches(2.0 / a, f.at("rdiv_s_" + dn))) << dn;
    EXPECT_TRUE(matches(pow(a, 2.0), f.at("pow2_s_" + dn))) << dn;
    EXPECT_TRUE(matches(pow(pos, 0.5), f.at("powh_s_" + dn))) << dn;
    EXPECT_TRUE(matches(pow(pos, 1.7), f.at("pow17_s_" + dn))) << dn;
    EXPECT_TRUE(matches(maximum(a, 0.25), f.at("max_s_" + dn))) << dn;
  }
}

TEST(Elementwise, MixedDtypesPromoteToF32) {
  if (!test::has_fixture(kBinary)) GTEST_SKIP() << "missing fixture " << kBinary;
  auto f = test::load_fixture(kBinary);
  const Tensor a16 = f.at("a_bf16");
  const Tensor row = f.at("b_row_f32"), mid = f.at("b_mid_f32");
  EXPECT_TRUE(matches(a16 + row, f.at("mixed_add")));
  EXPECT_TRUE(matches(mid * a16, f.at("mixed_mul")));
  // A 0-dim f32 tensor does not promote a bf16 tensor (torch.result_type).
  EXPECT_EQ((a16 + Tensor::from_floats({1.f}, {})).dtype(), DType::bf16);
  EXPECT_EQ((Tensor::from_ints({1, 2}, {2}) * 0.5).dtype(), DType::f32);
  EXPECT_EQ((Tensor::from_ints({1, 2}, {2}) * 2.0).dtype(), DType::i64);
}

TEST(Elementwise, StridedInputs) {
  if (!test::has_fixture(kBinary)) GTEST_SKIP() << "missing fixture " << kBinary;
  auto f = test::load_fixture(kBinary);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor a = f.at("a_" + dn), b = f.at("b_same_" + dn);
    // Same values through transposed views.
    const Tensor at = clone(a.transpose(0, 2)).transpose(0, 2);
    ASSERT_FALSE(at.is_contiguous());
    EXPECT_TRUE(matches(at * b, f.at("mul_same_" + dn)));
    EXPECT_TRUE(matches(silu(at), silu(a)));
  }
}

TEST(Elementwise, IntegerArithmetic) {
  const Tensor a = Tensor::from_ints({1, -2, 3, 4, 5, -6}, {2, 3});
  const Tensor b = Tensor::from_ints({10, 20, 30}, {3}, DType::i32);
  const Tensor s = a + b;
  EXPECT_EQ(s.dtype(), DType::i64);
  EXPECT_EQ(s.to_ints(), (std::vector<int64_t>{11, 18, 33, 14, 25, 24}));
  EXPECT_EQ(maximum(a, b * 0.5).dtype(), DType::f32);
  EXPECT_EQ(abs(a).to_ints(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const Tensor q = a / 2.0;
  EXPECT_EQ(q.dtype(), DType::f32);
  EXPECT_EQ(q.to_floats()[1], -1.f);
}

TEST(Elementwise, UnaryMatchesTorch) {
  if (!test::has_fixture(kUnary)) GTEST_SKIP() << "missing fixture " << kUnary;
  auto f = test::load_fixture(kUnary);
  const std::pair<const char*, UnaryOp> ops[] = {{"neg", UnaryOp::neg},
                                                 {"abs", UnaryOp::abs},
                                                 {"exp", UnaryOp::exp},
                                                 {"log", UnaryOp::log},
                                                 {"sqrt", UnaryOp::sqrt},
                                                 {"rsqrt", UnaryOp::rsqrt},
                                                 {"tanh", UnaryOp::tanh},
                                                 {"sigmoid", UnaryOp::sigmoid},
                                                 {"sin", UnaryOp::sin},
                                                 {"cos", UnaryOp::cos},
                                                 {"square", UnaryOp::square},
                                                 {"silu", UnaryOp::silu},
                                                 {"gelu", UnaryOp::gelu},
                                                 {"gelu_tanh", UnaryOp::gelu_tanh},
                                                 {"quick_gelu", UnaryOp::quick_gelu},
                                                 {"relu", UnaryOp::relu}};
  for (const std::string dn : {"f32", "bf16"}) {
    for (const auto& [name, op] : ops) {
      const std::string n = name;
      const bool positive = n == "log" || n == "sqrt" || n == "rsqrt";
      const Tensor x = f.at((positive ? "xp_" : "x_") + dn);
      const double gelu_atol = n.rfind("gelu", 0) == 0 ? 1e-6 : 0;
      EXPECT_TRUE(matches(unary(op, x), f.at(n + "_" + dn), 1e-6, gelu_atol)) << n << " " << dn;
    }
    for (const std::string n : {"silu", "gelu", "gelu_tanh", "exp", "sigmoid"}) {
      const Tensor x = astype(f.at("big_x"), dn == "f32" ? DType::f32 : DType::bf16);
      const UnaryOp op = n == "silu"        ? UnaryOp::silu
                         : n == "gelu"      ? UnaryOp::gelu
                         : n == "gelu_tanh" ? UnaryOp::gelu_tanh
                         : n == "exp"       ? UnaryOp::exp
                                            : UnaryOp::sigmoid;
      const double gelu_atol = n.rfind("gelu", 0) == 0 ? 1e-6 : 0;
      EXPECT_TRUE(matches(unary(op, x), f.at("big_" + n + "_" + dn), 1e-6, gelu_atol))
          << "big " << n << " " << dn;
    }
  }
}

TEST(Elementwise, GatedUnitsMatchTorch) {
  if (!test::has_fixture(kUnary)) GTEST_SKIP() << "missing fixture " << kUnary;
  auto f = test::load_fixture(kUnary);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor x = f.at("x_" + dn).slice(1, 0, 130);
    EXPECT_TRUE(matches(swiglu(x), f.at("swiglu_" + dn))) << dn;
    EXPECT_TRUE(matches(swiglu(x, /*gate_first=*/true), f.at("swiglu_gate_first_" + dn))) << dn;
    EXPECT_TRUE(matches(geglu(x), f.at("geglu_" + dn), 1e-6, 1e-6)) << dn;
    EXPECT_TRUE(matches(geglu(x, /*approximate=*/true), f.at("geglu_tanh_" + dn), 1e-6, 1e-6))
        << dn;
  }
}

TEST(Elementwise, WhereAndMaskedFill) {
  const Tensor c = Tensor::from_ints({1, 0, 1}, {3}, DType::boolean);
  const Tensor a = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_floats({-1}, {1});
  EXPECT_EQ(where(c, a, b).to_floats(), (std::vector<float>{1, -1, 3, 4, -1, 6}));
  const Tensor m = masked_fill(astype(a, DType::bf16), c, -1e9);
  EXPECT_EQ(m.dtype(), DType::bf16);
  EXPECT_EQ(m.to_floats()[1], 2.f);
  EXPECT_EQ(m.to_floats()[0], round_bf16(-1e9f));
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Elementwise, BadShapesNameOpAndShapes) {
  const Tensor a = Tensor::zeros({2, 3}, DType::f32), b = Tensor::zeros({4}, DType::f32);
  const std::string msg = error_of([&] { add(a, b); });
  EXPECT_NE(msg.find("[add]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(2, 3)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4,)"), std::string::npos) << msg;
  const std::string g = error_of([&] { swiglu(Tensor::zeros({2, 5}, DType::f32)); });
  EXPECT_NE(g.find("[glu]"), std::string::npos) << g;
  EXPECT_NE(g.find("(2, 5)"), std::string::npos) << g;
  const std::string w = error_of([&] { where(b, a, a); });
  EXPECT_NE(w.find("[where]"), std::string::npos) << w;
  const std::string t = error_of([&] { exp(Tensor::zeros({2}, DType::boolean)); });
  EXPECT_NE(t.find("[exp]"), std::string::npos) << t;
}

// Every ISA's row kernels agree with the scalar ones (FMA contraction aside).
TEST(Elementwise, IsaPathsAgree) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 4.f);
  const int64_t n = 1000 + 13;
  std::vector<float> x(n), y(n), o0(n), o1(n);
  for (auto& v : x) v = nd(rng);
  for (auto& v : y) v = nd(rng);
  x[0] = NAN;
  x[1] = 100.f;
  x[2] = -100.f;
  const EwKernels& ref = ew_kernels_scalar();
  // FMA contraction in the vector files moves results by an ulp; in GELU's 1 + erf that is an
  // absolute ~1e-7.
  auto close = [](float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || a == b ||
           std::fabs(a - b) <= 2e-6f * std::fabs(b) + 1e-6f;
  };
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa() < isa) continue;
    const EwKernels& k = ew_kernels_for(isa);
    for (int u = 0; u <= int(UnaryOp::relu); ++u) {
      ref.unary(UnaryOp(u), x.data(), o0.data(), n, false);
      k.unary(UnaryOp(u), x.data(), o1.data(), n, false);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(close(o1[i], o0[i])) << unary_op_name(UnaryOp(u)) << " " << cpu_isa_name(isa)
                                         << " at " << i << ": " << o1[i] << " vs " << o0[i];
    }
    for (int b = 0; b <= int(BinaryOp::pow); ++b) {
      for (int64_t sb : {0, 1}) {
        ref.binary(BinaryOp(b), x.data(), 1, y.data(), sb, o0.data(), n);
        k.binary(BinaryOp(b), x.data(), 1, y.data(), sb, o1.data(), n);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(close(o1[i], o0[i])) << binary_op_name(BinaryOp(b)) << " at " << i;
      }
    }
    std::vector<uint16_t> h0(n), h1(n);
    ref.f32_to_bf16(x.data(), h0.data(), n);
    k.f32_to_bf16(x.data(), h1.data(), n);
    EXPECT_EQ(h0, h1);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h0[i], f32_to_bf16(x[i]));
    EXPECT_EQ(ref.sum(y.data(), n), k.sum(y.data(), n));
  }
}

TEST(Elementwise, GeluTanhBlocksMatchSingleElements) {
  // A row's elements give the bits of the same elements one at a time, on every ISA, special
  // values included: the AVX2 file runs blocks of 64 in passes and a lone element as a
  // zero-padded vector, with block ends mid-row here.
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 4.f);
  const int64_t n = 64 * 3 + 8 * 5 + 3;
  std::vector<float> x(static_cast<size_t>(n)), row(x.size()), one(x.size());
  for (auto& v : x) v = nd(rng);
  const float special[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 9.5f, -9.5f, 100.f, -100.f, 1e-30f};
  for (size_t i = 0; i < std::size(special); ++i) x[i * 7] = special[i];
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa() < isa) continue;
    const EwKernels& k = ew_kernels_for(isa);
    k.unary(UnaryOp::gelu_tanh, x.data(), row.data(), n, false);
    for (int64_t i = 0; i < n; ++i)
      k.unary(UnaryOp::gelu_tanh, x.data() + i, one.data() + i, 1, false);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&row[size_t(i)], &one[size_t(i)], 4), 0)
          << cpu_isa_name(isa) << " at " << i << ": " << row[size_t(i)] << " vs " << one[size_t(i)];
  }
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Elementwise, RoundBf16InPlaceIsConvertAndBack) {
  // Every ISA's one-pass rounding equals f32 -> bf16 -> f32 bit for bit, NaN, infinities, ties
  // and subnormals included.
  std::vector<float> x;
  for (uint32_t u : {0x7fc00001u, 0x7f800001u, 0xff800000u, 0x7f800000u, 0x3f808000u, 0x3f818000u,
                     0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f7fffffu})
    x.push_back(bits_to_float(u));
  std::mt19937 rng(11);
  for (int i = 0; i < 4000; ++i) x.push_back(bits_to_float(uint32_t(rng())));
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa() < isa) continue;
    std::vector<float> r = x;
    ew_kernels_for(isa).round_bf16(r.data(), int64_t(r.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float e = bf16_to_f32(f32_to_bf16(x[i]));
      ASSERT_EQ(std::memcmp(&r[i], &e, 4), 0) << cpu_isa_name(isa) << " at " << i;
    }
  }
}

TEST(Elementwise, NormRowKernelsAreTheChainedTableCalls) {
  // layer_norm_row / rms_norm_row give, on every ISA, the bits of the table calls that norm.cpp
  // chains for rows longer than a chunk (sum, sum_sq_dev, scale_shift; sum_sq and two multiplies).
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa() < isa) continue;
    const EwKernels& k = ew_kernels_for(isa);
    // Rows of 16k floats (FLUX's head and hidden widths) take the AVX-512 file's register path:
    // many rows of those, one of the rest.
    for (int64_t n : {int64_t(1), int64_t(5), int64_t(16), int64_t(31), int64_t(32), int64_t(64),
                      int64_t(100), int64_t(128), kEwChunk}) {
      for (int rep = 0; rep < (n % 16 == 0 ? 64 : 1); ++rep) {
        const size_t len = static_cast<size_t>(n);
        std::vector<float> x(len), w(len), got(len), want(len);
        for (int64_t i = 0; i < n; ++i) {
          x[size_t(i)] = 3.f + 40.f * nd(rng);  // an offset, so the mean matters
          w[size_t(i)] = nd(rng);
        }
        const float eps = 1e-6f;
        double s = 0, q = 0;
        s += k.sum(x.data(), n);
        const float mean = float(s / double(n));
        q += k.sum_sq_dev(x.data(), mean, n);
        const float var = float(q / double(n));
        const float rstd = 1.f / std::sqrt(std::max(var, 0.f) + eps);
        k.scale_shift(x.data(), rstd, -rstd * mean, want.data(), n);
        k.layer_norm_row(x.data(), n, eps, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), size_t(n) * 4), 0)
            << "layer_norm_row " << cpu_isa_name(isa) << " n=" << n;
        double ss = 0;
        ss += k.sum_sq(x.data(), n);
        const float rr = 1.f / std::sqrt(float(ss) / float(n) + eps);
        for (const float* wp :
             {static_cast<const float*>(nullptr), static_cast<const float*>(w.data())}) {
          k.binary(BinaryOp::mul, x.data(), 1, &rr, 0, want.data(), n);
          if (wp) k.binary(BinaryOp::mul, want.data(), 1, wp, 1, want.data(), n);
          k.rms_norm_row(x.data(), n, eps, wp, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), size_t(n) * 4), 0)
              << "rms_norm_row " << cpu_isa_name(isa) << " n=" << n
              << " weight=" << (wp != nullptr);
        }
      }
    }
  }
}

TEST(Elementwise, NormRowsKernelsAreTheRowKernelOnEachRow) {
  // layer_norm_rows / rms_norm_rows (an ISA file may take 8 rows at once) give each row the bits
  // of layer_norm_row / rms_norm_row, on ordinary rows and on rows of zeros, -0, NaN and inf.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa() < isa) continue;
    const EwKernels& k = ew_kernels_for(isa);
    for (int64_t n : {int64_t(16), int64_t(32), int64_t(48), int64_t(128), int64_t(5), kEwChunk}) {
      for (int64_t rows : {int64_t(1), int64_t(8), int64_t(19), int64_t(64)}) {
        const size_t len = size_t(rows * n);
        std::vector<float> x(len), w(static_cast<size_t>(n)), got(len), want(len);
        for (auto& v : x) v = 3.f + 40.f * nd(rng);
        for (auto& v : w) v = nd(rng);
        if (rows >= 8) {  // special rows among ordinary ones
          std::fill(x.begin() + 1 * n, x.begin() + 2 * n, 0.f);
          std::fill(x.begin() + 2 * n, x.begin() + 3 * n, -0.f);
          x[size_t(3 * n)] = std::numeric_limits<float>::quiet_NaN();
          x[size_t(4 * n + 1)] = std::numeric_limits<float>::infinity();
          x[size_t(5 * n)] = 3e38f;
        }
        const float eps = 1e-6f;
        for (int64_t r = 0; r < rows; ++r)
          k.layer_norm_row(x.data() + r * n, n, eps, want.data() + r * n);
        k.layer_norm_rows(x.data(), rows, n, eps, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), len * 4), 0)
            << "layer_norm_rows " << cpu_isa_name(isa) << " n=" << n << " rows=" << rows;
        for (const float* wp :
             {static_cast<const float*>(nullptr), static_cast<const float*>(w.data())}) {
          for (int64_t r = 0; r < rows; ++r)
            k.rms_norm_row(x.data() + r * n, n, eps, wp, want.data() + r * n);
          k.rms_norm_rows(x.data(), rows, n, eps, wp, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), len * 4), 0)
              << "rms_norm_rows " << cpu_isa_name(isa) << " n=" << n << " rows=" << rows
              << " weight=" << (wp != nullptr);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
