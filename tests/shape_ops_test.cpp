// concat / split / chunk / pad against torch semantics (pad vs F.pad goldens).
#include "ops/shape_ops.h"

#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

const char* kShape = "ops/elementwise/shape.safetensors";

std::vector<float> iota(int64_t n, float start = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + float(i);
  return v;
}

TEST(ShapeOps, ConcatAndSplitRoundTrip) {
  const Tensor a = Tensor::from_floats(iota(2 * 3 * 4), {2, 3, 4});
  const Tensor b = Tensor::from_floats(iota(2 * 5 * 4, 100), {2, 5, 4}, DType::bf16);
  const Tensor c = concat({a, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 8, 4}));
  EXPECT_EQ(c.dtype(), DType::f32);  // bf16 with f32 promotes
  const auto parts = split(c, {3, 5}, 1);
  EXPECT_TRUE(test::bit_equal(contiguous(parts[0]), a));
  EXPECT_TRUE(test::bit_equal(astype(contiguous(parts[1]), DType::bf16), b));
  // Views share storage with the source.
  EXPECT_EQ(parts[1].storage(), c.storage());
  // Along the last dim, with a transposed (strided) input.
  const Tensor at = clone(a.transpose(1, 2)).transpose(1, 2);
  const Tensor d = concat({at, a}, -1);
  EXPECT_EQ(d.shape(), (Shape{2, 3, 8}));
  EXPECT_TRUE(test::bit_equal(contiguous(d.slice(2, 4, 8)), a));
  EXPECT_TRUE(test::bit_equal(contiguous(d.slice(2, 0, 4)), a));
}

TEST(ShapeOps, ChunkAndSplitBySizeFollowTorch) {
  const Tensor x = Tensor::from_floats(iota(10), {10});
  auto c = chunk(x, 3, 0);  // torch: sizes 4, 4, 2
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].shape(), (Shape{2}));
  EXPECT_EQ(c[2].to_floats(), (std::vector<float>{8, 9}));
  auto c4 = chunk(Tensor::from_floats(iota(6), {6}), 4, 0);  // torch: sizes 2, 2, 2
  EXPECT_EQ(c4.size(), 3u);
  auto s = split(x, 4, 0);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].to_floats(), (std::vector<float>{4, 5, 6, 7}));
}

TEST(ShapeOps, PadMatchesTorch) {
  if (!test::has_fixture(kShape)) GTEST_SKIP() << "missing fixture " << kShape;
  auto f = test::load_fixture(kShape);
  const Tensor x = f.at("x");
  EXPECT_TRUE(test::bit_equal(pad(x, {1, 2}), f.at("pad_last")));
  EXPECT_TRUE(test::bit_equal(pad(x, {0, 1, 0, 1}, 0.5), f.at("pad_hw")));
  EXPECT_TRUE(test::bit_equal(pad(x, {-1, 2, 1, -2}), f.at("pad_neg")));
  const Tensor p16 = pad(astype(x, DType::bf16), {0, 1, 0, 1}, 0.5);
  EXPECT_TRUE(test::bit_equal(p16, astype(f.at("pad_hw"), DType::bf16)));
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

TEST(ShapeOps, BadShapesNameOpAndShapes) {
  const Tensor a = Tensor::zeros({2, 3}, DType::f32), b = Tensor::zeros({3, 3}, DType::f32);
  std::string m = error_of([&] { concat({a, b}, 1); });
  EXPECT_NE(m.find("[concat]"), std::string::npos) << m;
  EXPECT_NE(m.find("(3, 3)"), std::string::npos) << m;
  m = error_of([&] { split(a, {1, 1}, 1); });
  EXPECT_NE(m.find("[split]"), std::string::npos) << m;
  m = error_of([&] { pad(a, {1, 2, 3}); });
  EXPECT_NE(m.find("[pad]"), std::string::npos) << m;
  m = error_of([&] { pad(a, {-2, -2}); });
  EXPECT_NE(m.find("[pad]"), std::string::npos) << m;
}

}  // namespace
}  // namespace tessera
