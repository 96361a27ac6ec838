// Conformance cases (tests/backend_conformance_test.cpp): matrix products, convolution,
// attention, softmax, norms, RoPE, reductions, lookups, shape ops and resampling.
#include <algorithm>
#include <array>

#include "conformance_cases.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linalg.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "ops/softmax.h"

namespace tessera::conformance {

// ---------------------------------------------------------------------------------------------
// Matrix products.

std::vector<Case> matmul_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 16; ++variant) {
    Builder b("matmul", seed++);
    const DType dt = variant < 8 ? DType::f32 : DType::bf16;
    const int64_t M = odd_size(b, 65), K = odd_size(b, 65), N = odd_size(b, 65);
    Shape sa = {M, K}, sb = {K, N};
    switch (variant % 4) {
      case 0:
        break;
      case 1:
        sa.insert(sa.begin(), odd_size(b, 5));
        sb.insert(sb.begin(), b.coin() ? 1 : sa[0]);
        break;
      case 2:
        sa.insert(sa.begin(), {2, 1});
        sb.insert(sb.begin(), 3);
        break;  // broadcast batch
      case 3:
        if (b.coin())
          sa = {K};
        else
          sb = {K};  // 1-D operands
        break;
    }
    const int ia = b.arg(sa, dt, b.pick({View::contiguous, View::transposed, View::offset}));
    const int ib = b.arg(sb, dt, b.pick({View::contiguous, View::transposed, View::offset}));
    cases.push_back(b.build(
        {"fn:matmul", "prim:matmul"}, [=](const Ins& in) { return Outs{matmul(in[ia], in[ib])}; },
        4));
  }
  for (int variant = 0; variant < 12; ++variant) {
    Builder b("linear", seed++);
    const DType dt = variant < 6 ? DType::f32 : DType::bf16;
    const int64_t K = odd_size(b, 65), N = odd_size(b, 65);
    Shape sx = odd_shape(b, int(1 + b.pick(3)), 17);
    sx.back() = K;
    const int ix = b.arg(sx, dt, b.pick({View::contiguous, View::transposed, View::strided}));
    const int iw = b.arg({N, K}, dt, b.pick({View::contiguous, View::transposed}));
    const bool bias = variant % 2 == 0;
    const int ibias = bias ? b.arg({N}, dt) : -1;
    cases.push_back(b.build(
        {"fn:linear", "prim:linear"},
        [=](const Ins& in) { return Outs{linear(in[ix], in[iw], bias ? in[ibias] : Tensor())}; },
        4));
  }
  // Past the small-GEMM limit (oneDNN in every mode) and with both threads.
  for (DType dt : {DType::f32, DType::bf16}) {
    Builder b("linear.large", seed++);
    const int ix = b.arg({67, 300}, dt);
    const int iw = b.arg({129, 300}, dt);
    const int ib = b.arg({129}, dt);
    cases.push_back(b.build(
        {"fn:linear", "prim:linear"},
        [=](const Ins& in) { return Outs{linear(in[ix], in[iw], in[ib])}; }, 8));
  }
  return cases;
}

std::vector<Case> conv_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 14; ++variant) {
    Builder b("conv2d", seed++);
    const DType dt = variant % 2 == 0 ? DType::f32 : DType::bf16;
    Conv2dParams p;
    const int64_t cin = b.pick({1, 3, 4, 6});
    p.groups = b.pick({int64_t(1), int64_t(1), cin % 2 == 0 ? int64_t(2) : int64_t(1), cin});
    const int64_t cout = p.groups * b.pick({1, 2, 3});
    const int64_t kh = b.pick({1, 3}), kw = b.pick({1, 3, 2});
    p.stride = {b.pick({1, 1, 2}), b.pick({1, 2})};
    p.dilation = {b.pick({1, 1, 2}), 1};
    p.padding = {b.pick({0, 1}), b.pick({0, 1, 2}), b.pick({0, 1}), b.pick({0, 2})};
    const int64_t n = b.pick({1, 2}), h = b.pick({5, 7, 9}), w = b.pick({5, 8, 11});
    const int ix =
        b.arg({n, cin, h, w}, dt, b.pick({View::contiguous, View::offset, View::strided}));
    const int iw = b.arg({cout, cin / p.groups, kh, kw}, dt);
    const bool bias = b.coin();
    const int ibias = bias ? b.arg({cout}, dt) : -1;
    // The torch-style overload: symmetric padding, no groups or dilation.
    const bool symmetric = variant >= 10 && p.groups == 1 && p.dilation[0] == 1;
    b.note("stride " + shape_of({p.stride[0], p.stride[1]}) + " pad " +
           shape_of({p.padding[0], p.padding[1], p.padding[2], p.padding[3]}) + " dil " +
           shape_of({p.dilation[0], p.dilation[1]}) + " groups " + std::to_string(p.groups) +
           (symmetric ? " symmetric" : ""));
    cases.push_back(b.build(
        {"fn:conv2d", "prim:conv2d"},
        [=](const Ins& in) {
          const Tensor bt = bias ? in[ibias] : Tensor();
          if (symmetric)
            return Outs{conv2d(in[ix], in[iw], bt, p.stride, {p.padding[0], p.padding[2]})};
          return Outs{conv2d(in[ix], in[iw], bt, p)};
        },
        4));
  }
  return cases;
}

// ---------------------------------------------------------------------------------------------
// Attention, softmax, norms, RoPE.

std::vector<Case> attention_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 16; ++variant) {
    Builder b("sdpa", seed++);
    const DType dt = variant % 2 == 0 ? DType::f32 : DType::bf16;
    const int64_t B = b.pick({1, 2}), Hkv = b.pick({1, 2}), H = Hkv * b.pick({1, 2});
    const int64_t Lq = b.pick({1, 5, 17, 33}), Lk = b.pick({1, 7, 33, 65});
    const int64_t D = b.pick({8, 16, 24, 64}), Dv = b.coin() ? D : b.pick({8, 32});
    // Half the cases hold q/k/v as (B, L, H, D) and transpose, as FLUX's attention does.
    const bool blhd = b.coin();
    auto shape = [&](int64_t h, int64_t l, int64_t d) {
      return blhd ? Shape{B, l, h, d} : Shape{B, h, l, d};
    };
    const int iq = b.arg(shape(H, Lq, D), dt);
    const int ik = b.arg(shape(Hkv, Lk, D), dt);
    const int iv = b.arg(shape(Hkv, Lk, Dv), dt);
    SdpaOptions o;
    o.causal = variant % 4 == 1;
    if (b.pick(3) == 0) o.scale = b.pick({1.0, 0.3});
    const int mask_kind = int(b.pick(3));  // none, bool, additive
    int im = -1;
    if (mask_kind > 0) {
      const Shape ms = {b.coin() ? B : 1, b.coin() ? H : 1, b.coin() ? Lq : 1, Lk};
      im = mask_kind == 1 ? b.arg(ms, DType::boolean, View::contiguous, Values::mask)
                          : b.arg(ms, b.coin() ? dt : DType::f32);
    }
    cases.push_back(b.build(
        {"fn:scaled_dot_product_attention", "prim:scaled_dot_product_attention"},
        [=](const Ins& in) {
          SdpaOptions opt = o;
          if (im >= 0) opt.mask = in[im];
          auto v = [&](int i) { return blhd ? in[i].transpose(1, 2) : in[i]; };
          return Outs{scaled_dot_product_attention(v(iq), v(ik), v(iv), opt)};
        },
        4));
  }
  return cases;
}

std::vector<Case> softmax_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 12; ++variant) {
    Builder b("softmax", seed++);
    const int nd = int(1 + b.pick(3));
    const Shape s = variant == 11 ? Shape{3, 2085} : odd_shape(b, nd, 65);
    const int ix =
        b.arg(s, float_dtype(b), any_view(b), variant % 3 == 2 ? Values::edges : Values::normal);
    const int64_t dim = -1 - b.pick(int64_t(s.size()));
    cases.push_back(b.build(
        {"fn:softmax", "prim:softmax"}, [=](const Ins& in) { return Outs{softmax(in[ix], dim)}; },
        2));
  }
  return cases;
}

std::vector<Case> norm_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 12; ++variant) {
    Builder b("layer_norm", seed++);
    const DType dt = float_dtype(b);
    Shape s = odd_shape(b, int(1 + b.pick(3)), 65);
    if (variant == 11) s = {2, 2100};  // rows longer than one chunk
    const int ix = b.arg(s, dt, any_view(b), variant % 4 == 3 ? Values::edges : Values::normal);
    const bool w = b.coin(), bi = b.coin();
    const DType pd = b.coin() ? dt : DType::f32;
    const int iw = w ? b.arg({s.back()}, pd) : -1, ib = bi ? b.arg({s.back()}, pd) : -1;
    const double eps = b.pick({1e-5, 1e-6});
    cases.push_back(b.build(
        {"fn:layer_norm", "prim:layer_norm"},
        [=](const Ins& in) {
          return Outs{layer_norm(in[ix], w ? in[iw] : Tensor(), bi ? in[ib] : Tensor(), eps)};
        },
        // Rows of one element are 0 up to the rounding of x * rstd (rstd = 1/sqrt(eps) ~ 316):
        // an FMA or not decides those ulps, so the absolute tolerance scales with rstd there.
        s.back() == 1 ? 200 : 2));
  }
  for (int variant = 0; variant < 16; ++variant) {
    Builder b("rms_norm", seed++);
    const RmsNormStyle style = variant % 2 ? RmsNormStyle::llama : RmsNormStyle::diffusers;
    const DType dt = float_dtype(b);
    Shape s = odd_shape(b, int(1 + b.pick(3)), 65);
    if (variant >= 14) s = {3, 2049};
    const int ix = b.arg(s, dt, any_view(b));
    const bool w = variant % 4 < 2 || style == RmsNormStyle::llama;
    const int iw = w ? b.arg({s.back()}, b.coin() ? dt : float_dtype(b)) : -1;
    cases.push_back(b.build(
        {"fn:rms_norm", "prim:rms_norm",
         style == RmsNormStyle::llama ? e("RmsNormStyle", "llama")
                                      : e("RmsNormStyle", "diffusers")},
        [=](const Ins& in) { return Outs{rms_norm(in[ix], w ? in[iw] : Tensor(), 1e-6, style)}; },
        2));
  }
  for (int variant = 0; variant < 10; ++variant) {
    Builder b("group_norm", seed++);
    const DType dt = float_dtype(b);
    const int64_t groups = b.pick({1, 2, 3, 4}), c = groups * b.pick({1, 2, 3});
    Shape s = {b.pick({1, 2}), c};
    for (int64_t i = 0, n = b.pick(3); i < n; ++i) s.push_back(odd_size(b, 17));
    const int ix =
        b.arg(s, dt, b.pick({View::contiguous, View::strided, View::offset, View::permuted}));
    const bool w = b.coin(), bi = b.coin();
    const int iw = w ? b.arg({c}, dt) : -1, ib = bi ? b.arg({c}, dt) : -1;
    cases.push_back(b.build(
        {"fn:group_norm", "prim:group_norm"},
        [=](const Ins& in) {
          return Outs{
              group_norm(in[ix], groups, w ? in[iw] : Tensor(), bi ? in[ib] : Tensor(), 1e-5)};
        },
        2));
  }
  return cases;
}

std::vector<Case> rope_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 6; ++variant) {
    Builder b("rope_frequencies", seed++);
    const std::vector<int64_t> axes =
        variant % 2 ? std::vector<int64_t>{8, 12, 12} : std::vector<int64_t>{4, 6};
    const int64_t L = odd_size(b, 33);
    Shape s = {L, int64_t(axes.size()) + b.pick(2)};
    if (variant >= 4) s.insert(s.begin(), 2);
    const int ix = b.arg(s, b.pick({DType::f32, DType::i64}), View::contiguous, Values::ids, 64);
    const double theta = b.pick({10000.0, 2000.0});
    cases.push_back(b.build(
        {"fn:rope_frequencies", "prim:rope_frequencies"},
        [=](const Ins& in) {
          auto [c, sn] = rope_frequencies(in[ix], axes, theta);
          return Outs{c, sn};
        },
        2));
  }
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::split_halves}) {
    for (RopeMath math : {RopeMath::fp32, RopeMath::input_dtype}) {
      for (int variant = 0; variant < 4; ++variant) {
        Builder b("apply_rope", seed++);
        const DType dt = variant == 0 ? DType::f32 : float_dtype(b);
        const int64_t B = b.pick({1, 2}), S = odd_size(b, 33), H = b.pick({1, 3}),
                      D = 2 * b.pick({1, 4, 8, 17});
        const int64_t sd = b.coin() ? 1 : 2;  // (B, S, H, D) or (B, H, S, D)
        const Shape xs = sd == 1 ? Shape{B, S, H, D} : Shape{B, H, S, D};
        const int ix = b.arg(xs, dt, b.pick({View::contiguous, View::strided, View::offset}));
        const Shape cs = b.coin() ? Shape{S, D} : Shape{B, S, D};
        const int ic = b.arg(cs, DType::f32), is = b.arg(cs, DType::f32);
        cases.push_back(b.build(
            {"fn:apply_rope", "prim:apply_rope",
             layout == RopeLayout::interleaved ? e("RopeLayout", "interleaved")
                                               : e("RopeLayout", "split_halves"),
             math == RopeMath::fp32 ? e("RopeMath", "fp32") : e("RopeMath", "input_dtype")},
            [=](const Ins& in) {
              return Outs{apply_rope(in[ix], in[ic], in[is], layout, sd, math)};
            },
            2));
      }
    }
  }
  return cases;
}

// ---------------------------------------------------------------------------------------------
// Reductions, lookups, shape ops, resampling.

std::vector<Case> reduce_cases(uint64_t seed) {
  std::vector<Case> cases;
  const std::pair<ReduceOp, const char*> ops[] = {{ReduceOp::sum, "sum"},
                                                  {ReduceOp::mean, "mean"},
                                                  {ReduceOp::var, "var"},
                                                  {ReduceOp::max, "max"},
                                                  {ReduceOp::argmax, "argmax"}};
  for (const auto& entry : ops) {
    const ReduceOp op = entry.first;
    const char* name = entry.second;
    for (int variant = 0; variant < 6; ++variant) {
      Builder b(std::string("reduce.") + name, seed++);
      const bool int_ok = op == ReduceOp::sum || op == ReduceOp::max || op == ReduceOp::argmax;
      const DType dt = variant == 5 && int_ok ? b.pick({DType::i32, DType::i64}) : float_dtype(b);
      const Shape s = variant == 4 ? Shape{5, 3001} : odd_shape(b, int(1 + b.pick(3)), 65);
      const Values v = !is_floating(dt) ? Values::ints
                       : variant == 3   ? Values::edges
                                        : Values::normal;
      const int ix = b.arg(s, dt, any_view(b), v);
      const int64_t dim = b.pick(int64_t(s.size())) - (b.coin() ? int64_t(s.size()) : 0);
      const bool keep = b.coin(), unbiased = b.coin();
      cases.push_back(b.build(
          {std::string("fn:") + name, std::string("prim:") + name, e("ReduceOp", name)},
          [=](const Ins& in) {
            switch (op) {
              case ReduceOp::sum:
                return Outs{sum(in[ix], dim, keep)};
              case ReduceOp::mean:
                return Outs{mean(in[ix], dim, keep)};
              case ReduceOp::var:
                return Outs{var(in[ix], dim, unbiased, keep)};
              case ReduceOp::max:
                return Outs{max(in[ix], dim, keep)};
              case ReduceOp::argmax:
                return Outs{argmax(in[ix], dim, keep)};
            }
            return Outs{};
          },
          op == ReduceOp::argmax ? 0 : 2));
    }
  }
  return cases;
}

std::vector<Case> embedding_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 8; ++variant) {
    Builder b("embedding", seed++);
    const int64_t V = odd_size(b, 65), D = odd_size(b, 65);
    const int iw =
        b.arg({V, D}, float_dtype(b), b.pick({View::contiguous, View::transposed, View::offset}));
    const int ii =
        b.arg(odd_shape(b, int(1 + b.pick(3)), 9), b.pick({DType::i64, DType::i32}),
              b.pick({View::contiguous, View::strided, View::broadcast}), Values::ids, V);
    cases.push_back(b.build(
        {"fn:embedding", "prim:embedding"},
        [=](const Ins& in) { return Outs{embedding(in[iw], in[ii])}; }, 0));
  }
  for (int variant = 0; variant < 6; ++variant) {
    Builder b("timestep_embedding", seed++);
    const int it = b.arg({odd_size(b, 17)}, b.pick({DType::f32, DType::i64, DType::bf16}),
                         b.pick({View::contiguous, View::strided}), Values::ids, 1000);
    const int64_t dim = b.pick({2, 33, 64, 256});
    const bool flip = b.coin();
    double shift = b.pick({0.0, 1.0, 0.5});
    if (double(dim / 2) == shift) shift = 0.0;
    const double scale = b.pick({1.0, 2.0}), period = b.pick({10000.0, 5000.0});
    cases.push_back(b.build(
        {"fn:timestep_embedding", "prim:timestep_embedding"},
        [=](const Ins& in) {
          return Outs{timestep_embedding(in[it], dim, flip, shift, scale, period)};
        },
        2));
  }
  return cases;
}

std::vector<Case> shape_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 10; ++variant) {
    Builder b("concat", seed++);
    const int nd = int(1 + b.pick(3));
    const Shape s = odd_shape(b, nd, 17);
    const int64_t dim = b.pick(nd);
    const int n = int(1 + b.pick(3));
    const DType dt = b.pick({DType::f32, DType::bf16, DType::i64});
    std::vector<int> idx;
    for (int i = 0; i < n; ++i) {
      Shape si = s;
      si[size_t(dim)] = odd_size(b, 9);
      // Mixed float dtypes promote (bf16 with f32 gives f32).
      const DType di = is_floating(dt) && variant % 3 == 1 ? float_dtype(b) : dt;
      idx.push_back(b.arg(si, di, any_view(b), is_floating(di) ? Values::normal : Values::ints));
    }
    cases.push_back(b.build(
        {"fn:concat", "prim:concat"},
        [=](const Ins& in) {
          std::vector<Tensor> ts;
          for (int i : idx) ts.push_back(in[i]);
          return Outs{concat(ts, dim)};
        },
        0));
  }
  for (int variant = 0; variant < 9; ++variant) {
    Builder b("split_chunk", seed++);
    const Shape s = odd_shape(b, int(1 + b.pick(3)), 17);
    const int64_t dim = b.pick(int64_t(s.size()));
    const int ix = b.arg(s, b.pick({DType::f32, DType::bf16}), any_view(b));
    const int form = variant % 3;
    std::vector<int64_t> sizes;
    for (int64_t left = s[size_t(dim)]; left > 0;) {
      const int64_t k = 1 + b.pick(left);
      sizes.push_back(k);
      left -= k;
    }
    const int64_t size = 1 + b.pick(s[size_t(dim)]), chunks = 1 + b.pick(4);
    Covers cov = form == 2 ? Covers{"fn:chunk"} : Covers{"fn:split"};
    // Views only; the exp makes each piece an op input (a view read by a kernel).
    cases.push_back(b.build(
        cov,
        [=](const Ins& in) {
          std::vector<Tensor> parts = form == 0   ? split(in[ix], sizes, dim)
                                      : form == 1 ? split(in[ix], size, dim)
                                                  : chunk(in[ix], chunks, dim);
          Outs out;
          for (const Tensor& p : parts) {
            out.push_back(p);
            out.push_back(exp(p));
          }
          return out;
        },
        // The pieces are exact; exp on another device's math library is within tolerance.
        1));
  }
  for (int variant = 0; variant < 8; ++variant) {
    Builder b("pad", seed++);
    const Shape s = odd_shape(b, int(1 + b.pick(3)), 17);
    const int ix = b.arg(s, b.pick({DType::f32, DType::bf16, DType::f16, DType::i64}), any_view(b),
                         Values::ints);
    std::vector<int64_t> pads;
    for (int64_t i = 0, n = 1 + b.pick(int64_t(s.size())); i < n; ++i) {
      const int64_t size = s[s.size() - 1 - size_t(i)];
      // Negative entries crop; keep at least one element.
      const int64_t before = b.pick(4) - (size > 2 ? 1 : 0), after = b.pick(3) - (size > 3 ? 1 : 0);
      pads.push_back(before);
      pads.push_back(after);
    }
    const double value = b.pick({0.0, -2.0, 1.5});
    cases.push_back(b.build(
        {"fn:pad", "prim:pad"}, [=](const Ins& in) { return Outs{pad(in[ix], pads, value)}; }, 0));
  }
  return cases;
}

std::vector<Case> resample_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 8; ++variant) {
    Builder b("upsample_nearest", seed++);
    const int ix = b.arg({b.pick({1, 2}), odd_size(b, 5), odd_size(b, 17), odd_size(b, 17)},
                         float_dtype(b), any_view(b), Values::edges);
    const int64_t factor = b.pick({1, 2, 2, 3});
    cases.push_back(b.build(
        {"fn:upsample_nearest", "prim:upsample_nearest"},
        [=](const Ins& in) { return Outs{upsample_nearest(in[ix], factor)}; }, 0));
  }
  return cases;
}

}  // namespace tessera::conformance
