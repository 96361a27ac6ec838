// matmul and linear against PyTorch goldens (reference/goldens/ops_linalg.py), plus the
// kernel caches and error messages.
#include "ops/linalg.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::all_close;
using test::bf16_close;

// f32: rtol 1e-5 with an atol of 1e-5 of the output's scale (sums reassociate); bf16: one ulp of
// torch's result or 1e-2 relative.
::testing::AssertionResult close_to_torch(const Tensor& actual, const Tensor& expected) {
  if (expected.dtype() == DType::bf16) return bf16_close(actual, expected);
  float scale = 0;
  for (float v : expected.to_floats()) scale = std::max(scale, std::fabs(v));
  return all_close(actual, expected, 1e-5, 1e-5 * std::max(1.0f, scale));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class LinalgFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(LinalgFixture, LinearMatchesTorch) {
  const std::string file = std::string("ops/linalg/linear_") + GetParam() + ".safetensors";
  if (!test::has_fixture(file)) GTEST_SKIP() << "missing fixture " << file;
  auto f = test::load_fixture(file);
  for (const char* name : {"l2d", "l3d", "lbig"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const Tensor x = f.at(n + ".x"), w = f.at(n + ".w"), b = f.at(n + ".b");
    EXPECT_TRUE(close_to_torch(linear(x, w, b), f.at(n + ".y")));
    EXPECT_TRUE(close_to_torch(linear(x, w), f.at(n + ".y_nobias")));
    // A second call reuses the cached primitive and packed weight; same numbers.
    EXPECT_TRUE(close_to_torch(linear(x, w, b), f.at(n + ".y")));
  }
}

TEST_P(LinalgFixture, MatmulMatchesTorch) {
  const std::string file = std::string("ops/linalg/matmul_") + GetParam() + ".safetensors";
  if (!test::has_fixture(file)) GTEST_SKIP() << "missing fixture " << file;
  auto f = test::load_fixture(file);
  for (const char* name : {"bcast", "shared", "batched", "vecmat", "matvec"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    EXPECT_TRUE(close_to_torch(matmul(f.at(n + ".a"), f.at(n + ".b")), f.at(n + ".y")));
  }
  // q @ k^T with k^T a transposed view (no copy in the op).
  EXPECT_TRUE(close_to_torch(matmul(f.at("qk.a"), f.at("qk.k").transpose(-1, -2)), f.at("qk.y")));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinalgFixture, ::testing::Values("f32", "bf16"));

TEST(Linalg, StridedInputsGiveTheSameResult) {
  const std::string file = "ops/linalg/linear_f32.safetensors";
  if (!test::has_fixture(file)) GTEST_SKIP() << "missing fixture " << file;
  auto f = test::load_fixture(file);
  const Tensor x = f.at("l2d.x"), w = f.at("l2d.w"), b = f.at("l2d.b");
  // Non-contiguous views of the same values: x^T^T via a copy laid out transposed.
  const Tensor xt = contiguous(x.transpose(0, 1)).transpose(0, 1);
  const Tensor wt = contiguous(w.transpose(0, 1)).transpose(0, 1);
  ASSERT_FALSE(xt.is_contiguous());
  EXPECT_TRUE(close_to_torch(linear(xt, wt, b), f.at("l2d.y")));
  EXPECT_TRUE(close_to_torch(matmul(xt, wt.transpose(0, 1)), f.at("l2d.y_nobias")));
  // Every other row: a sliced view with a row stride larger than K.
  const Tensor big = f.at("l3d.x").view({10, 33});
  const Tensor rows = big.slice(0, 0, 10, 2);
  EXPECT_TRUE(close_to_torch(linear(rows, f.at("l3d.w")), linear(contiguous(rows), f.at("l3d.w"))));
}

TEST(Linalg, CachesPrimitivesAndPackedWeights) {
  clear_kernel_caches();
  const Tensor x = Tensor::from_floats(std::vector<float>(48 * 64, 0.5f), {48, 64});
  const Tensor w = Tensor::from_floats(std::vector<float>(80 * 64, 0.25f), {80, 64});
  linear(x, w);
  const KernelCacheStats s1 = kernel_cache_stats();
  linear(x, w);
  const KernelCacheStats s2 = kernel_cache_stats();
  EXPECT_EQ(s2.primitive_misses, s1.primitive_misses) << "primitive was re-created";
  EXPECT_EQ(s2.primitive_hits, s1.primitive_hits + 1);
  EXPECT_EQ(s2.packed_misses, s1.packed_misses) << "weight was repacked twice";
  EXPECT_EQ(s2.packed_hits - s1.packed_hits, s1.packed_entries);  // a hit iff it was packed
  clear_kernel_caches();
  EXPECT_EQ(kernel_cache_stats().packed_entries, 0);
  EXPECT_EQ(kernel_cache_stats().packed_bytes, 0u);
}

TEST(Linalg, PackedWeightOfAFreedTensorIsNeverReused) {
  clear_kernel_caches();
  const Tensor x = Tensor::from_floats(std::vector<float>(32 * 48, 1.0f), {32, 48});
  for (int round = 1; round <= 4; ++round) {
    // Same shape each round, so a new weight may land at the freed one's address.
    const Tensor w = Tensor::from_floats(std::vector<float>(40 * 48, float(round)), {40, 48});
    const Tensor y = linear(x, w);
    EXPECT_FLOAT_EQ(y.to_floats()[0], 48.0f * float(round)) << "round " << round;
  }
}

TEST(Linalg, PackedCacheRespectsCapacity) {
  clear_kernel_caches();
  set_packed_weight_cache_capacity(0);
  const Tensor x = Tensor::from_floats(std::vector<float>(32 * 48, 1.0f), {32, 48});
  const Tensor w = Tensor::from_floats(std::vector<float>(40 * 48, 2.0f), {40, 48});
  EXPECT_FLOAT_EQ(linear(x, w).to_floats()[5], 96.0f);
  EXPECT_EQ(kernel_cache_stats().packed_entries, 0);
  set_packed_weight_cache_capacity(size_t(4) << 30);
}

TEST(Linalg, EmptyAndZeroK) {
  const Tensor x = Tensor::zeros({3, 0}, DType::f32), w = Tensor::zeros({4, 0}, DType::f32);
  const Tensor b = Tensor::from_floats({1, 2, 3, 4}, {4});
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  EXPECT_EQ(y.to_floats()[6], 3.0f);
  EXPECT_EQ(matmul(Tensor::zeros({0, 5}, DType::f32), Tensor::zeros({5, 2}, DType::f32)).shape(),
            (Shape{0, 2}));
}

TEST(Linalg, ErrorsNameTheOpAndTheShapes) {
  const Tensor a = Tensor::zeros({2, 5}, DType::f32), w = Tensor::zeros({4, 6}, DType::f32);
  std::string msg = error_of([&] { linear(a, w); });
  EXPECT_NE(msg.find("[linear]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has 5 features"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expects 6"), std::string::npos) << msg;

  msg = error_of([&] {
    linear(a, Tensor::zeros({4, 5}, DType::f32), Tensor::zeros({3}, DType::f32));
  });
  EXPECT_NE(msg.find("[linear] bias f32(3,) does not match weight f32(4, 5); expected shape (4,)"),
            std::string::npos)
      << msg;

  msg = error_of([&] { linear(a, Tensor::zeros({4, 5}, DType::bf16)); });
  EXPECT_NE(msg.find("[linear] mixed input dtypes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32(2, 5)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bf16(4, 5)"), std::string::npos) << msg;

  msg = error_of([&] { matmul(a, Tensor::zeros({4, 3}, DType::f32)); });
  EXPECT_NE(msg.find("[matmul] shapes (2, 5) and (4, 3) cannot be multiplied"), std::string::npos)
      << msg;

  msg = error_of([&] {
    matmul(Tensor::zeros({3, 2, 5}, DType::f32), Tensor::zeros({4, 5, 2}, DType::f32));
  });
  EXPECT_NE(msg.find("do not broadcast: 3 vs 4"), std::string::npos) << msg;

  msg = error_of([&] { matmul(a, Tensor::zeros({5, 2}, DType::bf16)); });
  EXPECT_NE(msg.find("[matmul] mixed input dtypes: a is f32(2, 5) and b is bf16(5, 2)"),
            std::string::npos)
      << msg;

  msg = error_of([&] {
    matmul(Tensor::zeros({2, 2}, DType::i64), Tensor::zeros({2, 2}, DType::i64));
  });
  EXPECT_NE(msg.find("expected dtype f32 or bf16"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tessera
