// Reductions against PyTorch goldens (reference/goldens/ops_elementwise.py).
#include "ops/reduce.h"

#include <cmath>

#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

const char* kReduce = "ops/elementwise/reduce.safetensors";

::testing::AssertionResult matches(const Tensor& a, const Tensor& e) {
  if (a.dtype() != e.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(a.dtype()) << " != expected " << dtype_name(e.dtype());
  if (e.dtype() == DType::bf16) return test::bf16_close(a, e);
  if (e.dtype() == DType::i64) return test::bit_equal(a, e);
  return test::all_close(a, e, 1e-5, 1e-6);
}

TEST(Reduce, MatchesTorchAlongEveryDim) {
  if (!test::has_fixture(kReduce)) GTEST_SKIP() << "missing fixture " << kReduce;
  auto f = test::load_fixture(kReduce);
  for (const std::string dn : {"f32", "bf16"}) {
    const Tensor x = f.at("x_" + dn);
    for (int64_t d : {0, 1, 2, -1}) {
      const std::string k = "d" + std::to_string((d + 3) % 3);
      EXPECT_TRUE(matches(sum(x, d), f.at("sum_" + k + "_" + dn))) << k << dn;
      EXPECT_TRUE(matches(mean(x, d, true), f.at("mean_" + k + "_keep_" + dn))) << k << dn;
      EXPECT_TRUE(matches(var(x, d), f.at("var_" + k + "_" + dn))) << k << dn;
      EXPECT_TRUE(matches(var(x, d, false), f.at("var_" + k + "_biased_" + dn))) << k << dn;
      EXPECT_TRUE(matches(max(x, d), f.at("max_" + k + "_" + dn))) << k << dn;
      EXPECT_TRUE(matches(argmax(x, d), f.at("argmax_" + k + "_" + dn))) << k << dn;
    }
  }
}

TEST(Reduce, IntegersAndNaN) {
  // CLIP pools at argmax(input_ids): integer argmax, first index of the maximum.
  const Tensor ids = Tensor::from_ints({5, 49407, 3, 49407, 1, 2, 3, 0}, {2, 4});
  EXPECT_EQ(argmax(ids, -1).to_ints(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(sum(ids, 1).dtype(), DType::i64);
  EXPECT_EQ(sum(ids, 1).to_ints(), (std::vector<int64_t>{98822, 6}));
  const Tensor x = Tensor::from_floats({1, NAN, 3, 4}, {4});
  EXPECT_TRUE(std::isnan(max(x, 0).item()));
  EXPECT_EQ(argmax(x, 0).to_ints()[0], 1);
}

TEST(Reduce, BadDimNamesOp) {
  try {
    sum(Tensor::zeros({2, 3}, DType::f32), 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
