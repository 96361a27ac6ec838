#include <gtest/gtest.h>

#include "ops/copy.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "test_util.h"

namespace tessera {
namespace {

Tensor arange(int64_t n, const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i);
  return Tensor::from_floats(v, shape);
}

TEST(Tensor, PermuteThenContiguousMatchesManualTranspose) {
  Tensor t = arange(6, {2, 3});
  Tensor p = t.transpose(0, 1);
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(contiguous(p).to_floats(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, SliceAndSelectAreViews) {
  Tensor t = arange(24, {2, 3, 4});
  Tensor s = t.slice(2, 1, 4, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.storage(), t.storage());
  EXPECT_EQ(s.to_floats()[0], 1.f);
  EXPECT_EQ(s.to_floats()[1], 3.f);
  EXPECT_EQ(t.select(1, 2).to_floats(), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
}

TEST(Tensor, ExpandBroadcastsWithZeroStride) {
  Tensor t = arange(3, {3, 1});
  Tensor e = t.expand({2, 3, 4});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  EXPECT_EQ(contiguous(e).to_floats()[5], 1.f);
  EXPECT_THROW(t.expand({2, 2}), Error);  // dim 0 is 3, cannot become 2
}

TEST(Tensor, ViewOfNonContiguousSplitsChunks) {
  Tensor t = arange(24, {2, 3, 4}).permute({1, 0, 2});  // (3, 2, 4), inner dims 2x4 not merged
  Tensor v = t.view({3, 2, 2, 2});
  EXPECT_EQ(contiguous(v).to_floats(), contiguous(t).to_floats());
  EXPECT_THROW(t.view({6, 4}), Error);
}

TEST(Tensor, CastRoundsLikeTorch) {
  Tensor t = Tensor::from_floats({1.00390625f, 1.01171875f, -3.3f}, {3});
  Tensor b = astype(t, DType::bf16);
  // 1 + 2^-8 is a tie between 1 and 1+2^-7: round to even gives 1.
  EXPECT_EQ(b.to_floats()[0], 1.0f);
  EXPECT_EQ(b.to_floats()[1], 1.015625f);
}

TEST(Allocator, ReusesFreedBlocksAndTracksPeak) {
  auto& a = cpu_allocator();
  a.reset_peak();
  const auto before = a.stats();
  { Tensor x = Tensor::empty({1024, 1024}, DType::f32); }
  const auto mid = a.stats();
  { Tensor y = Tensor::empty({1024, 1024}, DType::f32); }
  const auto after = a.stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GE(mid.peak_bytes, before.current_bytes + 4 * 1024 * 1024);
  EXPECT_EQ(after.reuse_count, mid.reuse_count + 1);
}

}  // namespace
}  // namespace tessera
