// Nearest 2x upsample against F.interpolate(scale_factor=2, mode="nearest").
#include "ops/resample.h"

#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

const char* kShape = "ops/elementwise/shape.safetensors";

TEST(Resample, NearestUpsampleMatchesTorch) {
  if (!test::has_fixture(kShape)) GTEST_SKIP() << "missing fixture " << kShape;
  auto f = test::load_fixture(kShape);
  const Tensor x = f.at("x");
  EXPECT_TRUE(test::bit_equal(upsample_nearest(x), f.at("up2")));
  EXPECT_TRUE(test::bit_equal(upsample_nearest(astype(x, DType::bf16)), f.at("up2_bf16")));
  // A strided (channels-last style) view gives the same result.
  const Tensor xt = clone(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
  ASSERT_FALSE(xt.is_contiguous());
  EXPECT_TRUE(test::bit_equal(upsample_nearest(xt), f.at("up2")));
}

TEST(Resample, BadRankNamesOp) {
  try {
    upsample_nearest(Tensor::zeros({2, 3, 4}, DType::f32));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[upsample_nearest]"), std::string::npos) << m;
    EXPECT_NE(m.find("(2, 3, 4)"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tessera
