// Layer, RMS and group norm against PyTorch/diffusers/transformers goldens
// (reference/goldens/ops_elementwise.py), including the bf16 cast orders.
#include "ops/norm.h"

#include <cmath>

#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

const char* kNorm = "ops/elementwise/norm.safetensors";

// f32 outputs are O(1) normalised values: rtol 1e-5 plus atol 1e-5 for the ones near 0.
::testing::AssertionResult matches(const Tensor& a, const Tensor& e) {
  if (a.dtype() != e.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(a.dtype()) << " != expected " << dtype_name(e.dtype());
  if (e.dtype() == DType::bf16) return test::bf16_close(a, e);
  return test::all_close(a, e, 1e-5, 1e-5);
}

TEST(Norm, LayerNormMatchesTorch) {
  if (!test::has_fixture(kNorm)) GTEST_SKIP() << "missing fixture " << kNorm;
  auto f = test::load_fixture(kNorm);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor x = f.at("x_" + dn), w = f.at("w_" + dn), b = f.at("b_" + dn);
    EXPECT_TRUE(matches(layer_norm(x, w, b, 1e-5), f.at("ln_affine_" + dn))) << dn;
    EXPECT_TRUE(matches(layer_norm(x, w, Tensor(), 1e-5), f.at("ln_weight_" + dn))) << dn;
    EXPECT_TRUE(matches(layer_norm(x, Tensor(), Tensor(), 1e-6), f.at("ln_plain_" + dn))) << dn;
  }
}

TEST(Norm, RmsNormCastOrdersMatchReference) {
  if (!test::has_fixture(kNorm)) GTEST_SKIP() << "missing fixture " << kNorm;
  auto f = test::load_fixture(kNorm);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor x = f.at("x_" + dn), w = f.at("w_" + dn);
    EXPECT_TRUE(matches(rms_norm(x, w, 1e-6), f.at("rms_" + dn))) << dn;
    EXPECT_TRUE(matches(rms_norm(x, Tensor(), 1e-6), f.at("rms_noweight_" + dn))) << dn;
    EXPECT_TRUE(matches(rms_norm(x, w, 1e-5, RmsNormStyle::llama), f.at("rms_llama_" + dn))) << dn;
  }
  // diffusers/T5: f32 activations with bf16 weights give bf16; bf16 with f32 weights give f32.
  const Tensor x32 = f.at("x_f32"), x16 = f.at("x_bf16");
  const Tensor w32 = f.at("w_f32"), w16 = f.at("w_bf16");
  EXPECT_TRUE(matches(rms_norm(x32, w16, 1e-6), f.at("rms_x32_w16")));
  EXPECT_TRUE(matches(rms_norm(x16, w32, 1e-6), f.at("rms_x16_w32")));
  EXPECT_TRUE(matches(rms_norm(x32, w16, 1e-5, RmsNormStyle::llama), f.at("rms_llama_x32_w16")));
}

TEST(Norm, GroupNormMatchesTorch) {
  if (!test::has_fixture(kNorm)) GTEST_SKIP() << "missing fixture " << kNorm;
  auto f = test::load_fixture(kNorm);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor x = f.at("gx_" + dn), w = f.at("gw_" + dn), b = f.at("gb_" + dn);
    EXPECT_TRUE(matches(group_norm(x, 32, w, b, 1e-6), f.at("gn32_" + dn))) << dn;
    EXPECT_TRUE(matches(group_norm(x, 8, w, b, 1e-5), f.at("gn8_" + dn))) << dn;
    EXPECT_TRUE(matches(group_norm(x, 8, Tensor(), Tensor(), 1e-5), f.at("gn8_plain_" + dn))) << dn;
  }
}

TEST(Norm, LongRowsAndStridedInput) {
  // A row longer than one kernel chunk, through a transposed view: compare with a double-precision
  // reference.
  const int64_t d = 5000;
  std::vector<float> v(size_t(2 * d));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 7919) % 1000) / 100.f + 3.f;
  const Tensor x = clone(Tensor::from_floats(v, {2, d}).transpose(0, 1)).transpose(0, 1);
  ASSERT_FALSE(x.is_contiguous());
  const auto y = layer_norm(x).to_floats();
  for (int64_t r = 0; r < 2; ++r) {
    double m = 0, q = 0;
    for (int64_t i = 0; i < d; ++i) m += v[size_t(r * d + i)];
    m /= double(d);
    for (int64_t i = 0; i < d; ++i) q += (v[size_t(r * d + i)] - m) * (v[size_t(r * d + i)] - m);
    const double rstd = 1.0 / std::sqrt(q / double(d) + 1e-5);
    for (int64_t i = 0; i < d; i += 97)
      ASSERT_NEAR(y[size_t(r * d + i)], (v[size_t(r * d + i)] - m) * rstd, 2e-5) << i;
  }
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

TEST(Norm, BadShapesNameOpAndShapes) {
  const Tensor x = Tensor::zeros({2, 6}, DType::f32);
  std::string m = error_of([&] { layer_norm(x, Tensor::zeros({5}, DType::f32)); });
  EXPECT_NE(m.find("[layer_norm]"), std::string::npos) << m;
  EXPECT_NE(m.find("(5,)"), std::string::npos) << m;
  EXPECT_NE(m.find("(2, 6)"), std::string::npos) << m;
  m = error_of([&] { rms_norm(x, Tensor::zeros({3}, DType::f32), 1e-6); });
  EXPECT_NE(m.find("[rms_norm]"), std::string::npos) << m;
  m = error_of([&] { group_norm(Tensor::zeros({1, 6, 2, 2}, DType::f32), 4); });
  EXPECT_NE(m.find("[group_norm]"), std::string::npos) << m;
  EXPECT_NE(m.find("(1, 6, 2, 2)"), std::string::npos) << m;
}

}  // namespace
}  // namespace tessera
