// Execution modes against strict eager: every op sequence gives strict eager's bits in deferred
// mode, the segment cache is hit by an identical segment, queued errors surface at sync points.
#include "runtime/modes.h"

#include <gtest/gtest.h>

#include <functional>

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/graph.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

// Restores strict eager (synchronous) after each test, whatever the environment asked for.
class Modes : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = eager_mode(); }
  void TearDown() override {
    set_eager_mode(saved_);
    set_async_dispatch(false);
    set_launch_blocking(false);
  }
  EagerMode saved_;
};

Tensor run_in(EagerMode mode, const std::function<Tensor()>& f) {
  const EagerMode before = eager_mode();
  set_eager_mode(mode);
  Tensor out = f();
  synchronize();
  out = clone(out);  // a materialised, contiguous copy (made eagerly below)
  set_eager_mode(before);
  return out;
}

// Strict eager, deferred (fused), deferred without fusion and asynchronous eager all agree.
void expect_modes_agree(const std::function<Tensor()>& f) {
  set_eager_mode(EagerMode::DeferNever);
  const Tensor ref = clone(f());
  const Tensor defer = run_in(EagerMode::DeferAndFuse, f);
  EXPECT_TRUE(test::bit_equal(defer, ref)) << "deferred and fused";
  const Tensor replayed = run_in(EagerMode::DeferAndFuse, f);  // cached segments, replayed
  EXPECT_TRUE(test::bit_equal(replayed, ref)) << "deferred and fused, second run";
  set_fusion_enabled(false);
  const Tensor nofuse = run_in(EagerMode::DeferAndFuse, f);
  set_fusion_enabled(true);
  EXPECT_TRUE(test::bit_equal(nofuse, ref)) << "deferred, fusion off";
  set_async_dispatch(true);
  const Tensor async = clone(f());
  synchronize();
  set_async_dispatch(false);
  EXPECT_TRUE(test::bit_equal(async, ref)) << "asynchronous eager";
}

Tensor rnd(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(s, dt, g);
}

TEST_F(Modes, ElementwiseChainsWithBroadcasting) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = rnd({2, 5, 33}, dt, 1), y = rnd({33}, dt, 2), z = rnd({2, 1, 33}, dt, 3);
    expect_modes_agree([&] {
      Tensor t = x * y + z;
      t = silu(t * 0.5 - 1.25);
      t = exp(neg(abs(t))) / (t + 3.0);
      return gelu(t, true) + maximum(t, x) - sqrt(square(t) + 1.0);
    });
    // Scalar-first forms and mixed dtypes (bf16 op f32 promotes).
    const Tensor w = rnd({5, 1}, DType::f32, 4);
    expect_modes_agree([&] { return sigmoid(2.0 - x) * w + (1.0 / (x * x + 1.0)); });
  }
}

TEST_F(Modes, NormModulateActivation) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = rnd({2, 7, 64}, dt, 5), scale = rnd({2, 1, 64}, dt, 6),
                 shift = rnd({2, 1, 64}, dt, 7), w = rnd({64}, dt, 8);
    expect_modes_agree(
        [&] { return silu(layer_norm(x, Tensor(), Tensor(), 1e-6) * (1.0 + scale) + shift); });
    expect_modes_agree([&] { return gelu(rms_norm(x, w, 1e-6) * (scale + 1.0) + shift, true); });
    expect_modes_agree([&] { return gelu(layer_norm(x, w, w * 0.5, 1e-5)); });
  }
}

TEST_F(Modes, ResidualAttentionBlockWithRope) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t B = 1, S = 12, H = 2, D = 16, C = H * D;
    const Tensor x = rnd({B, S, C}, dt, 9), wqkv = rnd({3 * C, C}, dt, 10),
                 wo = rnd({C, C}, dt, 11), gate = rnd({B, 1, C}, dt, 12);
    std::vector<float> ids(size_t(S) * 2);
    for (int64_t i = 0; i < S; ++i) ids[2 * i] = 0, ids[2 * i + 1] = float(i);
    const auto [cos, sin] = rope_frequencies(Tensor::from_floats(ids, {S, 2}), {8, 8}, 10000.0);
    expect_modes_agree([&, cos = cos, sin = sin] {
      const Tensor h = layer_norm(x, Tensor(), Tensor(), 1e-6) * (1.0 + gate);
      const Tensor qkv = linear(h, wqkv).view({B, S, 3, H, D});
      auto head = [&](int64_t i) {
        return apply_rope(qkv.select(2, i), cos, sin, RopeLayout::interleaved, 1).transpose(1, 2);
      };
      const Tensor q = head(0), k = head(1);
      const Tensor v = qkv.select(2, 2).transpose(1, 2);
      const Tensor a = scaled_dot_product_attention(contiguous(q), contiguous(k), contiguous(v));
      const Tensor o = linear(contiguous(a.transpose(1, 2)).reshape({B, S, C}), wo);
      return x + gate * o;
    });
  }
}

TEST_F(Modes, SchedulerStepArithmetic) {
  const Tensor sample = rnd({1, 16, 64}, DType::f32, 13);
  const Tensor v = rnd({1, 16, 64}, DType::bf16, 14);
  expect_modes_agree([&] {
    Tensor s = sample;
    const double sigmas[] = {1.0, 0.75, 0.5, 0.25, 0.0};
    for (int i = 0; i < 4; ++i) s = astype(s + v * (sigmas[i + 1] - sigmas[i]), DType::f32);
    return astype(s, DType::bf16);
  });
}

TEST_F(Modes, PendingTensorsHaveNoStorageUntilRead) {
  set_eager_mode(EagerMode::DeferAndFuse);
  const Tensor x = rnd({4, 8}, DType::f32, 15);
  const Tensor y = exp(x) + 1.0;
  EXPECT_EQ(y.impl()->storage, nullptr);
  EXPECT_NE(y.impl()->pending, nullptr);
  // Views of a pending tensor stay pending and read the right elements.
  const Tensor v = y.permute({1, 0}).slice(0, 2, 6).reshape({2, 2, 4});
  EXPECT_EQ(v.impl()->storage, nullptr);
  const Tensor w = v * 2.0;  // a recorded op on a view
  const std::vector<float> got = w.to_floats();
  set_eager_mode(EagerMode::DeferNever);
  const Tensor ref = (exp(x) + 1.0).permute({1, 0}).slice(0, 2, 6).reshape({2, 2, 4}) * 2.0;
  EXPECT_EQ(got, ref.to_floats());
  EXPECT_EQ(v.to_floats(), ((exp(x) + 1.0).permute({1, 0}).slice(0, 2, 6)).to_floats());
}

TEST_F(Modes, IdenticalSegmentHitsTheCache) {
  set_repeat_heuristic(false);
  const Tensor x = rnd({3, 40}, DType::f32, 16), b = rnd({40}, DType::f32, 17);
  auto step = [&] {
    Tensor y = silu(x * 1.5 + b) - x;
    synchronize();
    return y;
  };
  set_eager_mode(EagerMode::DeferAndFuse);
  step();
  const ModeStats a = mode_stats();
  step();
  const ModeStats c = mode_stats();
  EXPECT_EQ(c.compiles, a.compiles);
  EXPECT_EQ(c.cache_hits, a.cache_hits + 1);
  EXPECT_TRUE(last_segment_report().cache_hit);
  EXPECT_EQ(c.mode, "defer");
  set_repeat_heuristic(true);
}

TEST_F(Modes, RepeatedSuffixCutsIdenticalSegments) {
  set_repeat_heuristic(true);
  const Tensor x0 = rnd({2, 32}, DType::f32, 18), b = rnd({32}, DType::f32, 19);
  auto block = [&](Tensor x) { return tanh(x * 0.9 + b) + sigmoid(x); };
  set_eager_mode(EagerMode::DeferNever);
  Tensor ref = x0;
  for (int i = 0; i < 12; ++i) ref = block(ref);
  set_eager_mode(EagerMode::DeferAndFuse);
  reset_mode_stats();
  Tensor y = x0;
  for (int i = 0; i < 12; ++i) y = block(y);
  const ModeStats s = mode_stats();  // before the final read
  EXPECT_GE(s.segments, 3);
  EXPECT_GE(s.cache_hits, 2);
  EXPECT_TRUE(test::bit_equal(clone(y), ref));
}

// A kernel that fails when it runs (not when it is dispatched).
class Boom final : public Primitive {
 public:
  const char* name() const override { return "boom"; }
  void eval_cpu(const std::vector<Tensor>&, std::vector<Tensor>&) override {
    throw Error("[boom] the kernel failed");
  }
};

TEST_F(Modes, QueuedErrorSurfacesAtSyncNamingTheOp) {
  set_eager_mode(EagerMode::DeferNever);
  set_async_dispatch(true);
  const Tensor x = rnd({8}, DType::f32, 20);
  Tensor y;
  ASSERT_NO_THROW(y = dispatch1(std::make_shared<Boom>(), {x}, {x.shape(), x.dtype()}));
  const Tensor z = y + 1.0;  // queued after the failure: skipped
  try {
    z.to_floats();
    FAIL() << "expected the queued error at the read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  // Reported once; the stream works again.
  EXPECT_NO_THROW(synchronize());
  EXPECT_EQ((x * 2.0).to_floats().size(), 8u);
  // Explicit synchronize() is a sync point too.
  dispatch1(std::make_shared<Boom>(), {x}, {x.shape(), x.dtype()});
  EXPECT_THROW(synchronize(), Error);
}

TEST_F(Modes, LaunchBlockingRaisesAtTheOp) {
  set_eager_mode(EagerMode::DeferNever);
  set_async_dispatch(true);
  set_launch_blocking(true);
  const Tensor x = rnd({8}, DType::f32, 21);
  EXPECT_THROW(dispatch1(std::make_shared<Boom>(), {x}, {x.shape(), x.dtype()}), Error);
}

TEST_F(Modes, DeferredErrorSurfacesAtMaterialisation) {
  set_eager_mode(EagerMode::DeferAndFuse);
  const Tensor x = rnd({8}, DType::f32, 22);
  const Tensor y = dispatch1(std::make_shared<Boom>(), {x}, {x.shape(), x.dtype()});
  EXPECT_THROW(y.to_floats(), Error);
  EXPECT_THROW(y.to_floats(), Error);  // still no data, with a clear message
  EXPECT_EQ((x + 1.0).to_floats().size(), 8u);
}

TEST_F(Modes, DeadFusedChainIsSkipped) {
  set_eager_mode(EagerMode::DeferAndFuse);
  set_repeat_heuristic(false);
  const Tensor x = rnd({4, 4}, DType::f32, 24);
  { const Tensor unused = exp(x * 2.0) + 1.0; }
  const Tensor kept = x - 1.0;
  synchronize();
  set_repeat_heuristic(true);
  EXPECT_EQ(last_segment_report().kernels, 1);
  set_eager_mode(EagerMode::DeferNever);
  EXPECT_TRUE(test::bit_equal(kept, x - 1.0));
}

TEST_F(Modes, CachedSegmentIsReplayedWithoutRecording) {
  set_repeat_heuristic(false);
  clear_segment_cache();
  const Tensor x = rnd({3, 40}, DType::f32, 30), b = rnd({40}, DType::f32, 31);
  auto step = [&] { return silu(x * 1.5 + b) - x; };
  set_eager_mode(EagerMode::DeferNever);
  const Tensor ref = step();
  set_eager_mode(EagerMode::DeferAndFuse);
  reset_mode_stats();
  for (int i = 0; i < 4; ++i) {
    const Tensor y = step();
    synchronize();
    EXPECT_TRUE(test::bit_equal(y, ref)) << "run " << i;
    EXPECT_EQ(last_segment_report().replayed, i > 0) << "run " << i;
    EXPECT_EQ(last_segment_report().fused_kernels, 1);
  }
  const ModeStats s = mode_stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.cache_hits, 3);
  set_repeat_heuristic(true);
}

TEST_F(Modes, ReplayMismatchFallsBackToRecording) {
  set_repeat_heuristic(false);
  clear_segment_cache();
  const Tensor x = rnd({3, 40}, DType::f32, 32), b = rnd({40}, DType::f32, 33),
               x2 = rnd({2, 40}, DType::f32, 34);
  using Fn = std::function<Tensor()>;
  const Fn base = [&] { return tanh(x * 1.5 + b) - x; };
  const std::vector<Fn> variants = {
      [&] { return sigmoid(x * 1.5 + b) - x; },       // another op in the middle
      [&] { return tanh(x * 2.5 + b) - x; },          // another attribute
      [&] { return tanh(x2 * 1.5 + b) - x2; },        // other shapes
      [&] { return tanh(x * 1.5 + x) - x; },          // another edge
      [&] { return (tanh(x * 1.5 + b) - x) * 3.0; },  // longer
      [&] { return tanh(x * 1.5 + b); },              // shorter
      [&] {
        return tanh(x.reshape({40, 3}).transpose(0, 1) * 1.5 + b) - x;
      },  // other strides
  };
  for (size_t k = 0; k < variants.size(); ++k) {
    set_eager_mode(EagerMode::DeferNever);
    const Tensor ref = variants[k]();
    set_eager_mode(EagerMode::DeferAndFuse);
    for (int i = 0; i < 2; ++i) {  // the base segment is cached and predicted next
      base();
      synchronize();
    }
    const Tensor y = variants[k]();
    synchronize();
    EXPECT_FALSE(last_segment_report().replayed) << "variant " << k;
    EXPECT_TRUE(test::bit_equal(y, ref)) << "variant " << k;
  }
  set_repeat_heuristic(true);
}

TEST_F(Modes, ReplayHonoursWhatTheUserHolds) {
  set_repeat_heuristic(false);
  clear_segment_cache();
  const Tensor x = rnd({4, 24}, DType::f32, 35), b = rnd({24}, DType::f32, 36);
  set_eager_mode(EagerMode::DeferNever);
  const Tensor ref_mid = x * 0.5 + b, ref = exp(ref_mid) - x;
  set_eager_mode(EagerMode::DeferAndFuse);
  for (int i = 0; i < 2; ++i) {
    const Tensor y = exp(x * 0.5 + b) - x;
    synchronize();
    EXPECT_TRUE(test::bit_equal(y, ref));
  }
  EXPECT_TRUE(last_segment_report().replayed);
  for (int i = 0; i < 3; ++i) {  // now an intermediate is held too: another fingerprint
    const Tensor mid = x * 0.5 + b;
    const Tensor y = exp(mid) - x;
    synchronize();
    EXPECT_EQ(last_segment_report().replayed, i > 0) << "run " << i;
    EXPECT_TRUE(test::bit_equal(mid, ref_mid)) << "run " << i;
    EXPECT_TRUE(test::bit_equal(y, ref)) << "run " << i;
  }
  set_repeat_heuristic(true);
}

TEST_F(Modes, ReplayedSegmentErrorNamesTheOp) {
  set_repeat_heuristic(false);
  set_eager_mode(EagerMode::DeferAndFuse);
  const Tensor x = rnd({8}, DType::f32, 37);
  for (int i = 0; i < 3; ++i) {
    const Tensor y = dispatch1(std::make_shared<Boom>(), {x * 2.0}, {x.shape(), x.dtype()});
    try {
      y.to_floats();
      FAIL() << "expected the kernel's error at the read, run " << i;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
    }
    EXPECT_THROW(y.to_floats(), Error);
  }
  EXPECT_EQ((x + 1.0).to_floats().size(), 8u);
  set_repeat_heuristic(true);
}

TEST_F(Modes, ReplayOffMatchesReplayOn) {
  const Tensor x0 = rnd({2, 32}, DType::f32, 38), b = rnd({32}, DType::f32, 39);
  auto run = [&] {
    Tensor y = x0;
    for (int i = 0; i < 9; ++i) y = tanh(y * 0.9 + b) + sigmoid(y);
    return clone(y);
  };
  set_eager_mode(EagerMode::DeferNever);
  const Tensor ref = run();
  set_eager_mode(EagerMode::DeferAndFuse);
  set_segment_replay(false);
  const Tensor off = run();
  set_segment_replay(true);
  const Tensor on1 = run(), on2 = run();
  EXPECT_TRUE(test::bit_equal(off, ref));
  EXPECT_TRUE(test::bit_equal(on1, ref));
  EXPECT_TRUE(test::bit_equal(on2, ref));
}

TEST_F(Modes, LaterStepsReplayEverySegmentAndCompileNothing) {
  const Tensor x0 = rnd({2, 48}, DType::f32, 40), b = rnd({48}, DType::f32, 41);
  auto step = [&](Tensor y) {
    for (int i = 0; i < 6; ++i) y = tanh(y * 0.9 + b) + sigmoid(y);  // repeated blocks
    return x0 + (y - x0) * 0.25;                                     // the scheduler's update
  };
  set_eager_mode(EagerMode::DeferNever);
  Tensor ref = x0;
  for (int s = 0; s < 3; ++s) ref = clone(step(ref));
  set_eager_mode(EagerMode::DeferAndFuse);
  clear_segment_cache();
  Tensor y = x0;
  for (int s = 0; s < 3; ++s) {
    if (s == 2) reset_mode_stats();  // steps 0-1 plan the segments and learn their order
    y = step(y);
    y.to_floats();  // a sync point per step, as a pipeline's progress read would be
  }
  const ModeStats st = mode_stats();
  EXPECT_EQ(st.compiles, 0);
  EXPECT_GE(st.segments, 2);
  EXPECT_EQ(st.cache_hits, st.segments);
  EXPECT_EQ(st.replayed_segments, st.segments);
  EXPECT_NE(mode_stats_json(st).find("\"replayed_segments\""), std::string::npos);
  EXPECT_TRUE(test::bit_equal(clone(y), ref));
}

TEST_F(Modes, StatsJson) {
  reset_mode_stats();
  set_eager_mode(EagerMode::DeferNever);
  const Tensor x = rnd({4}, DType::f32, 23);
  (x + 1.0).to_floats();
  const ModeStats s = mode_stats();
  EXPECT_EQ(s.mode, "eager");
  EXPECT_GE(s.ops_dispatched, 1);
  const std::string j = mode_stats_json(s);
  for (const char* key : {"\"mode\"", "\"compiles\"", "\"cache_hits\"", "\"compile_seconds\"",
                          "\"fused_kernels\"", "\"ops_dispatched\""})
    EXPECT_NE(j.find(key), std::string::npos) << j;
}

}  // namespace
}  // namespace tessera
