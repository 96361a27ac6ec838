// Prepared kernels (Primitive::prepare_cpu, used by compiled programs): each must compute
// eval_cpu's exact bits for the views it was prepared for, on every run, with new storages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "runtime/compile.h"
#include "runtime/cpu_features.h"
#include "runtime/parallel.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

Tensor rnd(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(s, dt, g);
}

// Runs the prepared kernel twice on fresh inputs and compares with eval_cpu each time.
void check_prepared(Primitive& p, const std::vector<std::vector<Tensor>>& runs,
                    const std::vector<TensorSpec>& specs, const std::string& what) {
  auto empty_outs = [&] {
    std::vector<Tensor> o;
    for (const auto& s : specs) o.push_back(Tensor::empty(s.shape, s.dtype));
    return o;
  };
  std::vector<Tensor> proto = empty_outs();
  auto kernel = p.prepare_cpu(runs[0], proto);
  ASSERT_NE(kernel, nullptr) << what;
  for (size_t r = 0; r < runs.size(); ++r) {
    std::vector<Tensor> ref = empty_outs(), got = empty_outs();
    p.eval_cpu(runs[r], ref);
    kernel->run(runs[r], got);
    for (size_t q = 0; q < ref.size(); ++q)
      EXPECT_TRUE(test::bit_equal(got[q], ref[q])) << what << " run " << r << " output " << q;
  }
}

TEST(PreparedKernel, LinearMatchesEvalBitForBit) {
  struct Case {
    int64_t M, K, N;
    bool bias;
  };
  // FLUX tiny shapes (width 32, MLP 128, single-block 160), a vector row, odd sizes, K > 64
  // (the AMX kernel for bf16 on AMX CPUs) and K <= 64 (oneDNN); with two threads, products on
  // either side of min_parallel_work() (256 x 64 x 64 is exactly 2^20 multiply-adds: split).
  const Case cases[] = {{80, 32, 96, true},   {320, 32, 128, true}, {320, 160, 32, true},
                        {1, 256, 192, true},  {7, 33, 5, false},    {64, 64, 64, false},
                        {130, 96, 70, true},  {256, 64, 64, true},  {255, 64, 64, false},
                        {1024, 128, 96, true}};
  const int saved = num_threads();
  for (int threads : {1, 2})
    for (DType dt : {DType::f32, DType::bf16}) {
      set_num_threads(threads);
      for (const Case& c : cases) {
        Linear op(c.bias);
        std::vector<std::vector<Tensor>> runs;
        // Two runs with other weights too (regional programs bind each layer's weights).
        for (uint64_t s = 1; s <= 3; ++s) {
          std::vector<Tensor> in{rnd({c.M, c.K}, dt, s), rnd({c.N, c.K}, dt, s + 10)};
          if (c.bias) in.push_back(rnd({c.N}, dt, s + 20));
          runs.push_back(in);
        }
        runs.push_back(runs[0]);  // the first weight again (the remembered packed form)
        check_prepared(op, runs, {{{c.M, c.N}, dt}},
                       std::string(dtype_name(dt)) + " linear " + std::to_string(c.M) + "x" +
                           std::to_string(c.K) + "x" + std::to_string(c.N) + " threads " +
                           std::to_string(threads));
      }
    }
  set_num_threads(saved);
}

TEST(PreparedKernel, AttentionMatchesEvalBitForBit) {
  struct Case {
    int64_t B, H, Lq, Lk, D;
    bool causal;
  };
  // FLUX tiny (2 heads x 16, 80 / 320 tokens: one and two query blocks), key tails, causal.
  const Case cases[] = {{1, 2, 80, 80, 16, false},
                        {1, 2, 320, 320, 16, false},
                        {2, 3, 37, 600, 48, false},
                        {1, 2, 300, 300, 16, true},
                        {1, 1, 1, 5, 8, false}};
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (DType dt : {DType::f32, DType::bf16}) {
      for (const Case& c : cases) {
        ScaledDotProductAttention op(c.causal, 1.0 / std::sqrt(double(c.D)), false);
        std::vector<std::vector<Tensor>> runs;
        for (uint64_t s = 1; s <= 2; ++s)
          runs.push_back({rnd({c.B, c.H, c.Lq, c.D}, dt, s), rnd({c.B, c.H, c.Lk, c.D}, dt, s + 5),
                          rnd({c.B, c.H, c.Lk, c.D}, dt, s + 9)});
        // A permuted (B, L, H, D) layout read in place, as FLUX's attention passes it.
        const Tensor qp = rnd({c.B, c.Lq, c.H, c.D}, dt, 3).permute({0, 2, 1, 3});
        const Tensor kp = rnd({c.B, c.Lk, c.H, c.D}, dt, 4).permute({0, 2, 1, 3});
        const Tensor vp = rnd({c.B, c.Lk, c.H, c.D}, dt, 6).permute({0, 2, 1, 3});
        const std::string what = std::string(dtype_name(dt)) + " sdpa Lq " + std::to_string(c.Lq) +
                                 " Lk " + std::to_string(c.Lk) + (c.causal ? " causal" : "") +
                                 " threads " + std::to_string(threads);
        const std::vector<TensorSpec> specs{{{c.B, c.H, c.Lq, c.D}, dt}};
        if (c.D % 32 == 0) continue;  // AMX CPUs: eval_cpu runs the AMX kernels, none prepared
        if (cpu_isa() == CpuIsa::scalar) {  // eval_cpu runs the reference loops, none prepared
          std::vector<Tensor> proto{Tensor::empty(specs[0].shape, specs[0].dtype)};
          EXPECT_EQ(op.prepare_cpu(runs[0], proto), nullptr) << what;
          continue;
        }
        check_prepared(op, runs, specs, what);
        check_prepared(op, {{qp, kp, vp}}, specs, what + " permuted");
      }
    }
  }
  set_num_threads(saved);
}

TEST(PreparedKernel, RmsNormMatchesEvalBitForBit) {
  for (RmsNormStyle style : {RmsNormStyle::diffusers, RmsNormStyle::llama}) {
    for (bool weight : {true, false}) {
      for (int64_t d : {16, 128, 100, 2048}) {
        RmsNorm op(1e-6, style, weight);
        std::vector<std::vector<Tensor>> runs;
        for (uint64_t s = 1; s <= 2; ++s) {
          std::vector<Tensor> in{rnd({2, 37, d}, DType::f32, s) * 3.0};
          if (weight) in.push_back(rnd({d}, DType::f32, s + 4));
          runs.push_back(in);
        }
        check_prepared(op, runs, {{{2, 37, d}, DType::f32}},
                       "rms_norm d " + std::to_string(d) + (weight ? " weight" : "") +
                           (style == RmsNormStyle::llama ? " llama" : ""));
      }
    }
  }
  // Not prepared (eval_cpu runs): bf16, rows wider than a chunk.
  RmsNorm op(1e-6, RmsNormStyle::diffusers, false);
  std::vector<Tensor> out{Tensor::empty({2, 4096}, DType::f32)};
  EXPECT_EQ(op.prepare_cpu({rnd({2, 4096}, DType::f32, 1)}, out), nullptr);
  std::vector<Tensor> out16{Tensor::empty({2, 16}, DType::bf16)};
  EXPECT_EQ(op.prepare_cpu({rnd({2, 16}, DType::bf16, 1)}, out16), nullptr);
}

TEST(PreparedKernel, RopeMatchesEvalBitForBit) {
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::split_halves}) {
    for (bool batched : {false, true}) {
      // FLUX: x (B, S, H, D) with sequence_dim 1; tables (S, D) or (B, S, D).
      ApplyRope op(layout, RopeMath::fp32, 1);
      const Shape tab = batched ? Shape{2, 40, 16} : Shape{40, 16};
      std::vector<std::vector<Tensor>> runs;
      for (uint64_t s = 1; s <= 2; ++s)
        runs.push_back({rnd({2, 40, 3, 16}, DType::f32, s), rnd(tab, DType::f32, s + 3),
                        rnd(tab, DType::f32, s + 6)});
      check_prepared(op, runs, {{{2, 40, 3, 16}, DType::f32}},
                     std::string("rope") + (batched ? " batched" : "") +
                         (layout == RopeLayout::interleaved ? " interleaved" : " halves"));
    }
  }
  // Rows split over two threads (chunks starting inside a sequence and a batch) and a head
  // dim that is not a multiple of four or eight (the rotations' scalar tails).
  const int saved = num_threads();
  set_num_threads(2);
  for (const Shape& x : {Shape{2, 300, 3, 16}, Shape{2, 50, 3, 6}, Shape{1, 20, 2, 20}}) {
    ApplyRope op(RopeLayout::interleaved, RopeMath::fp32, 1);
    const Shape tab{2, x[1], x[3]};
    check_prepared(op, {{rnd(x, DType::f32, 1), rnd(tab, DType::f32, 2), rnd(tab, DType::f32, 3)}},
                   {{x, DType::f32}}, "rope batched, 2 threads, D " + std::to_string(x[3]));
  }
  set_num_threads(saved);
  ApplyRope seq2(RopeLayout::interleaved, RopeMath::input_dtype, 2);  // (B, H, S, D)
  check_prepared(seq2,
                 {{rnd({1, 2, 24, 8}, DType::f32, 1), rnd({24, 8}, DType::f32, 2),
                   rnd({24, 8}, DType::f32, 3)}},
                 {{{1, 2, 24, 8}, DType::f32}}, "rope sequence_dim 2");
}

TEST(PreparedKernel, RopeFrequenciesRemembersTheLastIdsOnly) {
  // FLUX's (S, 3) ids: the same ids again (the tables handed out again), other ids, then the
  // first ids once more, and ids that differ in one position only.
  RopeFrequencies op({4, 6, 6}, 10000.0);
  auto ids = [](int64_t rows, float shift) {
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t a = 0; a < 3; ++a) v.push_back(a == 0 ? shift : float((r * (a + 1)) % 17));
    return Tensor::from_floats(v, {rows, 3});
  };
  Tensor a = ids(40, 0.f), b = ids(40, 1.f);
  std::vector<float> one(120);
  std::memcpy(one.data(), a.raw_data(), one.size() * 4);
  one[100] += 1.f;
  Tensor c = Tensor::from_floats(one, {40, 3});
  check_prepared(op, {{a}, {a}, {b}, {a}, {c}, {c}},
                 {{{40, 16}, DType::f32}, {{40, 16}, DType::f32}}, "rope_frequencies");
}

TEST(PreparedKernel, StridedCopyAndConcatMatchEvalBitForBit) {
  // FLUX's attention output (B, H, L, D) -> (B, L, H, D), a view starting mid-storage, bf16;
  // concatenations along a middle and the last dim. Each run binds other storages (and offsets).
  for (DType dt : {DType::f32, DType::bf16}) {
    Copy copy;
    std::vector<std::vector<Tensor>> runs;
    for (uint64_t s = 1; s <= 2; ++s) runs.push_back({rnd({1, 2, 37, 16}, dt, s).transpose(1, 2)});
    check_prepared(copy, runs, {{{1, 37, 2, 16}, dt}}, "copy (B, L, H, D)");
    runs.clear();
    for (uint64_t s = 1; s <= 2; ++s)
      runs.push_back({rnd({3, 9, 5}, dt, s).slice(0, 1, 3).slice(2, 1, 4)});
    check_prepared(copy, runs, {{{2, 9, 3}, dt}}, "copy of a sliced view");
    Concat mid(1), last(2);
    runs.clear();
    for (uint64_t s = 1; s <= 2; ++s)
      runs.push_back({rnd({1, 8, 2, 16}, dt, s), rnd({1, 64, 2, 16}, dt, s + 5)});
    check_prepared(mid, runs, {{{1, 72, 2, 16}, dt}}, "concat dim 1");
    runs.clear();
    for (uint64_t s = 1; s <= 2; ++s)
      runs.push_back(
          {rnd({2, 65, 32}, dt, s), rnd({2, 65, 128}, dt, s + 5), rnd({2, 65, 3}, dt, s + 9)});
    check_prepared(last, runs, {{{2, 65, 163}, dt}}, "concat last dim");
  }
  // Mixed dtypes and non-contiguous inputs are left to eval_cpu.
  Copy copy;
  std::vector<Tensor> out{Tensor::empty({4, 3}, DType::f32)};
  EXPECT_EQ(copy.prepare_cpu({rnd({3, 4}, DType::bf16, 1).transpose(0, 1)}, out), nullptr);
  Concat cat(0);
  out = {Tensor::empty({6, 3}, DType::f32)};
  EXPECT_EQ(cat.prepare_cpu(
                {rnd({3, 3}, DType::f32, 1).transpose(0, 1), rnd({3, 3}, DType::f32, 2)}, out),
            nullptr);
}

TEST(PreparedKernel, F32BinaryMatchesEvalBitForBit) {
  // Same-shape operands and scalars (either side), sizes around a chunk; every op but pow.
  for (int64_t n : {int64_t(32), int64_t(2048), int64_t(5000)}) {
    const Shape s{1, 1, n};
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div,
                        BinaryOp::maximum, BinaryOp::minimum}) {
      Binary bin(op);
      check_prepared(bin,
                     {{rnd(s, DType::f32, 1), rnd(s, DType::f32, 2)},
                      {rnd(s, DType::f32, 3), rnd(s, DType::f32, 4)}},
                     {{s, DType::f32}}, std::string(binary_op_name(op)) + " " + shape_str(s));
      for (bool first : {false, true}) {
        BinaryScalar bs(op, 1.0 / 3.0, first);
        check_prepared(bs, {{rnd(s, DType::f32, 5)}, {rnd(s, DType::f32, 6)}}, {{s, DType::f32}},
                       std::string(binary_op_name(op)) + " scalar " + shape_str(s));
      }
    }
  }
  // Broadcasts, bf16 and pow are left to eval_cpu.
  Binary add(BinaryOp::add);
  std::vector<Tensor> out{Tensor::empty({4, 8}, DType::f32)};
  EXPECT_EQ(add.prepare_cpu({rnd({4, 8}, DType::f32, 1), rnd({1, 8}, DType::f32, 2)}, out),
            nullptr);
  BinaryScalar pw(BinaryOp::pow, 2.0, false);
  EXPECT_EQ(pw.prepare_cpu({rnd({4, 8}, DType::f32, 1)}, out), nullptr);
  out = {Tensor::empty({4, 8}, DType::bf16)};
  BinaryScalar half(BinaryOp::add, 0.5, false);
  EXPECT_EQ(half.prepare_cpu({rnd({4, 8}, DType::bf16, 1)}, out), nullptr);
}

TEST(PreparedKernel, PrimitivesWithoutAHookRunEval) {
  // The default hook prepares nothing (the program calls eval_cpu).
  ScaledDotProductAttention masked(false, 0.25, true);
  const Tensor q = rnd({1, 1, 4, 8}, DType::f32, 1);
  std::vector<Tensor> out{Tensor::empty({1, 1, 4, 8}, DType::f32)};
  EXPECT_EQ(masked.prepare_cpu({q, q, q, Tensor::zeros({1, 1, 4, 4}, DType::f32)}, out), nullptr);
}

}  // namespace
}  // namespace tessera
