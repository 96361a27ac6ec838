// Structure of deferred mode's fusion: which ops become one kernel, and what gets allocated.
#include <gtest/gtest.h>

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/norm.h"
#include "runtime/allocator.h"
#include "runtime/graph.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

class Fusion : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = eager_mode();
    set_eager_mode(EagerMode::DeferNever);
    set_repeat_heuristic(false);  // one segment per test, cut at the read
  }
  void TearDown() override {
    set_eager_mode(saved_);
    set_repeat_heuristic(true);
  }
  EagerMode saved_;
};

Tensor rnd(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(s, dt, g);
}

int64_t allocs() {
  return cpu_allocator().stats().alloc_count;
}

// f() in strict eager (the reference) and as one deferred segment, with that segment's report;
// checks that every output of the segment has eager's bits.
template <typename F>
SegmentReport deferred_matches_eager(F f) {
  const std::vector<Tensor> ref = f();
  set_eager_mode(EagerMode::DeferAndFuse);
  const std::vector<Tensor> out = f();
  synchronize();
  const SegmentReport r = last_segment_report();
  set_eager_mode(EagerMode::DeferNever);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_TRUE(test::bit_equal(out[i], ref[i])) << "output " << i;
  return r;
}

TEST_F(Fusion, NormModulateActivationIsOneKernelWithNoIntermediates) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = rnd({2, 9, 96}, dt, 1), shift = rnd({2, 1, 96}, dt, 2);
    const Tensor scale1 = rnd({2, 1, 96}, dt, 3) + 1.0;  // (1 + scale), computed eagerly
    const Tensor ref = silu(layer_norm(x, Tensor(), Tensor(), 1e-6) * scale1 + shift);
    set_eager_mode(EagerMode::DeferAndFuse);
    const Tensor y = silu(layer_norm(x, Tensor(), Tensor(), 1e-6) * scale1 + shift);
    const int64_t before = allocs();
    synchronize();
    const int64_t used = allocs() - before;
    const SegmentReport r = last_segment_report();
    set_eager_mode(EagerMode::DeferNever);
    EXPECT_EQ(r.nodes, 4);
    EXPECT_EQ(r.kernels, 1);
    EXPECT_EQ(r.fused_kernels, 1);
    EXPECT_EQ(r.fused_ops, 4);
    EXPECT_EQ(r.allocations, 1);
    EXPECT_EQ(used, 1) << "only the chain's output is allocated";
    EXPECT_TRUE(test::bit_equal(y, ref));
  }
}

TEST_F(Fusion, IntermediateHeldByTheUserIsKept) {
  const Tensor x = rnd({3, 50}, DType::f32, 4);
  set_eager_mode(EagerMode::DeferAndFuse);
  const Tensor a = x * 2.0;
  const Tensor b = exp(a) + 1.0;
  const int64_t before = allocs();
  synchronize();
  const SegmentReport r = last_segment_report();
  EXPECT_EQ(allocs() - before, 2);
  EXPECT_EQ(r.kernels, 1);
  set_eager_mode(EagerMode::DeferNever);
  EXPECT_TRUE(test::bit_equal(a, x * 2.0));
  EXPECT_TRUE(test::bit_equal(b, exp(x * 2.0) + 1.0));
}

TEST_F(Fusion, BroadcastOperandsAndShapeChangesSplitGroups) {
  const Tensor x = rnd({4, 1, 16}, DType::f32, 5), y = rnd({4, 8, 16}, DType::f32, 6);
  const SegmentReport r = deferred_matches_eager([&] {
    const Tensor small = sigmoid(x) * 3.0;                // shape (4, 1, 16): its own group
    return std::vector<Tensor>{tanh(y - small) * small};  // (4, 8, 16): reads `small` broadcast
  });
  EXPECT_EQ(r.kernels, 2);
  EXPECT_EQ(r.fused_kernels, 2);
}

TEST_F(Fusion, NonElementwiseOpsBreakChainsButKeepResults) {
  const Tensor x = rnd({6, 32}, DType::f32, 7), w = rnd({32, 32}, DType::f32, 8);
  const SegmentReport r = deferred_matches_eager([&] {
    const Tensor h = gelu(x * 0.5 + 1.0);
    const Tensor m = linear(h, w);
    return std::vector<Tensor>{silu(m) + x};
  });
  EXPECT_EQ(r.kernels, 3);  // fused(mul,add,gelu), linear, fused(silu,add)
  EXPECT_EQ(r.fused_kernels, 2);
}

TEST_F(Fusion, ViewOfAnIntermediateIsMaterialised) {
  const Tensor x = rnd({8, 8}, DType::f32, 9);
  auto f = [&] {
    const Tensor a = exp(x) * 0.25;
    return a.transpose(0, 1) + a;  // reads `a` through a transposed view
  };
  const Tensor ref = f();
  set_eager_mode(EagerMode::DeferAndFuse);
  const Tensor out = f();
  synchronize();
  const SegmentReport r = last_segment_report();
  set_eager_mode(EagerMode::DeferNever);
  EXPECT_EQ(r.kernels, 2);
  EXPECT_TRUE(test::bit_equal(out, ref));
}

// Narrow rows are evaluated many rows per chunk: operands whose rows are not one contiguous run
// (per-batch broadcast, a transposed view, a per-row scalar) are gathered row by row; chunks and
// blocks end mid-tensor. Bit-identical to eager.
TEST_F(Fusion, NarrowRowsManyPerChunkMatchEager) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = rnd({3, 700, 24}, dt, 11), gate = rnd({3, 1, 24}, dt, 12);
    const Tensor tr = rnd({3, 24, 700}, dt, 13).transpose(1, 2);  // inner stride 700
    const Tensor per_row = rnd({3, 700, 1}, dt, 14), w = rnd({24}, dt, 15);
    auto f = [&] {
      const Tensor h = rms_norm(x, w, 1e-6) * gate + tr;
      return silu(h * per_row) + x * 0.5;
    };
    const Tensor ref = f();
    set_eager_mode(EagerMode::DeferAndFuse);
    const Tensor out = f();
    synchronize();
    const SegmentReport r = last_segment_report();
    set_eager_mode(EagerMode::DeferNever);
    EXPECT_EQ(r.fused_kernels, 1);
    EXPECT_TRUE(test::bit_equal(out, ref)) << dtype_name(dt);
  }
}

// f32 norms on rows of 16k floats run straight into the chunk (several rows at once where the
// ISA can), and the last value is written in place of its chunk buffer: with weight and bias,
// RMS with and without a weight, a row count that is not a multiple of 8, rows across chunks
// and blocks, and a kept intermediate as a second output. Bit-identical to eager.
TEST_F(Fusion, F32NormRowsIntoTheChunkMatchEager) {
  for (const Shape& s : {Shape{1, 37, 32}, Shape{2, 300, 64}, Shape{1, 5, 16}}) {
    const int64_t d = s.back();
    const Tensor x = rnd(s, DType::f32, 21), w = rnd({d}, DType::f32, 22),
                 b = rnd({d}, DType::f32, 23), scale = rnd({1, 1, d}, DType::f32, 24),
                 shift = rnd({1, 1, d}, DType::f32, 25);
    SegmentReport r = deferred_matches_eager([&] {
      const Tensor n = layer_norm(x, w, b, 1e-6);
      return std::vector<Tensor>{n, gelu(n * scale + shift, true)};
    });
    EXPECT_EQ(r.fused_kernels, 1) << shape_str(s);
    r = deferred_matches_eager([&] {
      return std::vector<Tensor>{rms_norm(x, w, 1e-6) * scale + x,
                                 rms_norm(x, Tensor(), 1e-6, RmsNormStyle::llama) - shift};
    });
    EXPECT_EQ(r.fused_kernels, 1) << shape_str(s);
    r = deferred_matches_eager(
        [&] { return std::vector<Tensor>{layer_norm(x, Tensor(), Tensor(), 1e-6) * scale}; });
    EXPECT_EQ(r.fused_kernels, 1) << shape_str(s);
  }
}

TEST_F(Fusion, InterleavedChainsOfTwoShapesAreTwoKernels) {
  // FLUX's image and text streams: the same norm -> modulate chain on two token counts, issued
  // op by op in turn. Each chain is one kernel although the other's ops arrive in between.
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor img = rnd({1, 16, 32}, dt, 11), txt = rnd({1, 24, 32}, dt, 12);
    const Tensor s1 = rnd({1, 1, 32}, dt, 13), s2 = rnd({1, 1, 32}, dt, 14);
    const SegmentReport r = deferred_matches_eager([&] {
      const Tensor a = layer_norm(img, Tensor(), Tensor(), 1e-6);
      const Tensor b = layer_norm(txt, Tensor(), Tensor(), 1e-6);
      const Tensor a2 = a * s1;
      const Tensor b2 = b * s2;
      return std::vector<Tensor>{a2 + s2, b2 + s1};
    });
    EXPECT_EQ(r.nodes, 6);
    EXPECT_EQ(r.kernels, 2);
    EXPECT_EQ(r.fused_kernels, 2);
    EXPECT_EQ(r.allocations, 2);
  }
}

TEST_F(Fusion, AstypeJoinsTheNormBeforeIt) {
  // FLUX's q/k RMSNorm: bf16 in, an f32 weight, f32 out, rounded back to bf16 by astype. The
  // f32 intermediate is never written; the two norms side by side stay two kernels.
  const Tensor q = rnd({1, 10, 2, 16}, DType::bf16, 15), k = rnd({1, 10, 2, 16}, DType::bf16, 16);
  const Tensor w = rnd({16}, DType::f32, 17);
  const SegmentReport r = deferred_matches_eager([&] {
    return std::vector<Tensor>{astype(rms_norm(q, w, 1e-6), DType::bf16),
                               astype(rms_norm(k, w, 1e-6), DType::bf16)};
  });
  EXPECT_EQ(r.nodes, 4);
  EXPECT_EQ(r.fused_kernels, 1);  // fused(rms_norm, copy, rms_norm, copy)
  EXPECT_EQ(r.allocations, 2);
  // Norms with nothing to fuse after them stay on their own (prepared) kernels.
  const SegmentReport r2 = deferred_matches_eager([&] {
    return std::vector<Tensor>{rms_norm(q, Tensor(), 1e-6), rms_norm(k, Tensor(), 1e-6)};
  });
  EXPECT_EQ(r2.kernels, 2);
  EXPECT_EQ(r2.fused_kernels, 0);
}

TEST_F(Fusion, FusionOffRunsEveryOp) {
  const Tensor x = rnd({5, 5}, DType::bf16, 10);
  set_fusion_enabled(false);
  set_eager_mode(EagerMode::DeferAndFuse);
  const Tensor y = silu(x * 2.0 + 1.0);
  synchronize();
  const SegmentReport r = last_segment_report();
  set_eager_mode(EagerMode::DeferNever);
  set_fusion_enabled(true);
  EXPECT_EQ(r.kernels, 3);
  EXPECT_EQ(r.fused_kernels, 0);
  EXPECT_TRUE(test::bit_equal(y, silu(x * 2.0 + 1.0)));
}

}  // namespace
}  // namespace tessera
