// Backend conformance (issue 18 part 6): every op of src/ops/*.h on seeded random shapes (odd
// sizes, broadcasts, strided views), dtypes and edge values, on every available device, in
// every execution mode, against the CPU's strict eager. The harness is conformance_cases.h.
// TESSERA_CONFORMANCE_SEED=N draws other cases (the failing case's name carries its shapes).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

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
#include "runtime/graph.h"

namespace tessera::conformance {
namespace {

using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;
using Covers = std::set<std::string>;

uint64_t base_seed() {
  const char* s = std::getenv("TESSERA_CONFORMANCE_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261218ull;
}

View any_view(Builder& b) {
  return b.pick({View::contiguous, View::contiguous, View::transposed, View::strided, View::offset,
                 View::broadcast, View::permuted});
}
DType float_dtype(Builder& b) { return b.pick({DType::f32, DType::bf16, DType::f16}); }
DType mm_dtype(Builder& b) { return b.pick({DType::f32, DType::bf16}); }
std::string e(const char* type, const char* value) {
  return std::string("enum:") + type + "::" + value;
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

struct BinaryEntry {
  BinaryOp op;
  const char* fn;
  Tensor (*tt)(const Tensor&, const Tensor&);
  Tensor (*ts)(const Tensor&, double);
};
const BinaryEntry kBinary[] = {
    {BinaryOp::add, "add", [](const Tensor& a, const Tensor& b) { return a + b; },
     [](const Tensor& a, double s) { return a + s; }},
    {BinaryOp::sub, "sub", [](const Tensor& a, const Tensor& b) { return a - b; },
     [](const Tensor& a, double s) { return a - s; }},
    {BinaryOp::mul, "mul", [](const Tensor& a, const Tensor& b) { return a * b; },
     [](const Tensor& a, double s) { return a * s; }},
    {BinaryOp::div, "div", [](const Tensor& a, const Tensor& b) { return a / b; },
     [](const Tensor& a, double s) { return a / s; }},
    {BinaryOp::maximum, "maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
     [](const Tensor& a, double s) { return maximum(a, s); }},
    {BinaryOp::minimum, "minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
     [](const Tensor& a, double s) { return minimum(a, s); }},
    {BinaryOp::pow, "pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
     [](const Tensor& a, double s) { return pow(a, s); }},
};
// b's shape: a's with some dims 1 and maybe fewer leading dims (numpy broadcasting).
Shape broadcast_partner(Builder& b, Shape& a) {
  Shape s = a;
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t r = b.pick(4);
    if (r == 0) s[i] = 1;
    if (r == 1 && s[i] > 1) a[i] = 1;
  }
  if (s.size() > 1 && b.pick(3) == 0) s.erase(s.begin());
  return s;
}

std::vector<Case> binary_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (const BinaryEntry& be : kBinary) {
    for (int variant = 0; variant < 6; ++variant) {
      Builder b(std::string("binary.") + be.fn, seed++);
      DType da, db;
      switch (variant) {
        case 0: da = db = DType::f32; break;
        case 1: da = db = DType::bf16; break;
        case 2: da = db = DType::f16; break;
        case 3: da = DType::bf16, db = b.pick({DType::f32, DType::f16}); break;  // promotes
        case 4: da = b.pick({DType::i32, DType::i64}), db = b.pick({DType::i64, DType::f32}); break;
        default: da = float_dtype(b), db = da; break;
      }
      Shape sa = odd_shape(b, int(1 + b.pick(4)));
      Shape sb = broadcast_partner(b, sa);
      if (variant == 5) sb = b.coin() ? Shape{} : Shape{1};  // 0-dim / one-element operand
      const Values va = is_floating(da) ? b.pick({Values::normal, Values::edges}) : Values::ints;
      const Values vb = is_floating(db) ? b.pick({Values::normal, Values::edges, Values::positive})
                                        : Values::ints;
      const int ia = b.arg(sa, da, any_view(b), va);
      const int ib = b.arg(sb, db, any_view(b), vb);
      const BinaryEntry* p = &be;
      const bool named = b.coin();
      cases.push_back(b.build(
          {"fn:binary", std::string("fn:") + be.fn, std::string("prim:") + be.fn,
           e("BinaryOp", be.fn)},
          [p, ia, ib, named](const Ins& in) {
            return Outs{named ? p->tt(in[ia], in[ib]) : binary(p->op, in[ia], in[ib])};
          }));
    }
  }
  return cases;
}

std::vector<Case> binary_scalar_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (const BinaryEntry& be : kBinary) {
    for (int variant = 0; variant < 5; ++variant) {
      Builder b(std::string("scalar.") + be.fn, seed++);
      // torch's special pow forms (2, 3, 0.5, -0.5, -1, -2) and general scalars.
      const double s = b.pick({2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7, 0.0, -3.25, 1e-3, 1e4});
      const DType dt =
          variant < 3 ? std::array{DType::f32, DType::bf16, DType::f16}[size_t(variant)]
                      : b.pick({DType::i32, DType::i64, DType::bf16});
      const Values v = is_floating(dt) ? b.pick({Values::normal, Values::edges, Values::positive})
                                       : Values::ints;
      const int ix = b.arg(odd_shape(b, int(1 + b.pick(3)), 65), dt, any_view(b), v);
      const int form = int(b.pick(3));  // x op s (named / binary()), s op x
      const BinaryEntry* p = &be;
      Covers cov = {"fn:binary", std::string("prim:") + be.fn, e("BinaryOp", be.fn)};
      if (form == 0) cov.insert(std::string("fn:") + be.fn);
      cases.push_back(b.build(cov, [p, ix, s, form](const Ins& in) {
        if (form == 0) return Outs{p->ts(in[ix], s)};
        if (form == 1) return Outs{binary(p->op, in[ix], s)};
        // s / x is reciprocal(x) * s (two scalar ops), s - x and the rest one reversed op.
        return Outs{binary(p->op, s, in[ix])};
      }));
    }
  }
  // The reversed named forms: s - x, s / x, and the operators with a scalar on the left.
  for (int i = 0; i < 3; ++i) {
    Builder b("scalar.reversed", seed++);
    const int ix = b.arg(odd_shape(b, 2, 65), float_dtype(b), any_view(b), Values::edges);
    cases.push_back(b.build({"fn:sub", "fn:div", "fn:add", "fn:mul", "prim:sub", "prim:div"},
                            [ix](const Ins& in) {
                              const Tensor& x = in[ix];
                              return Outs{sub(2.5, x), div(3.0, x), 1.5 + x, 0.25 * x, 2.0 - x,
                                          4.0 / x};
                            }));
  }
  return cases;
}

struct UnaryEntry {
  UnaryOp op;
  const char* value;  // the enum value's name
  const char* fn;     // the named wrapper
  Tensor (*f)(const Tensor&);
};
const UnaryEntry kUnary[] = {
    {UnaryOp::neg, "neg", "neg", [](const Tensor& x) { return -x; }},
    {UnaryOp::abs, "abs", "abs", [](const Tensor& x) { return abs(x); }},
    {UnaryOp::exp, "exp", "exp", [](const Tensor& x) { return exp(x); }},
    {UnaryOp::log, "log", "log", [](const Tensor& x) { return log(x); }},
    {UnaryOp::sqrt, "sqrt", "sqrt", [](const Tensor& x) { return sqrt(x); }},
    {UnaryOp::rsqrt, "rsqrt", "rsqrt", [](const Tensor& x) { return rsqrt(x); }},
    {UnaryOp::tanh, "tanh", "tanh", [](const Tensor& x) { return tanh(x); }},
    {UnaryOp::sigmoid, "sigmoid", "sigmoid", [](const Tensor& x) { return sigmoid(x); }},
    {UnaryOp::sin, "sin", "sin", [](const Tensor& x) { return sin(x); }},
    {UnaryOp::cos, "cos", "cos", [](const Tensor& x) { return cos(x); }},
    {UnaryOp::square, "square", "square", [](const Tensor& x) { return square(x); }},
    {UnaryOp::silu, "silu", "silu", [](const Tensor& x) { return silu(x); }},
    {UnaryOp::gelu, "gelu", "gelu", [](const Tensor& x) { return gelu(x); }},
    {UnaryOp::gelu_tanh, "gelu_tanh", "gelu", [](const Tensor& x) { return gelu(x, true); }},
    {UnaryOp::quick_gelu, "quick_gelu", "quick_gelu", [](const Tensor& x) { return quick_gelu(x); }},
    {UnaryOp::relu, "relu", "relu", [](const Tensor& x) { return relu(x); }},
};

std::vector<Case> unary_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (const UnaryEntry& ue : kUnary) {
    for (int variant = 0; variant < 5; ++variant) {
      Builder b(std::string("unary.") + ue.value, seed++);
      const DType dt = variant < 3 ? std::array{DType::f32, DType::bf16, DType::f16}[size_t(variant)]
                       : variant == 3 ? b.pick({DType::i32, DType::i64})
                                      : float_dtype(b);
      const Values v = !is_floating(dt) ? Values::ints
                       : variant == 4  ? Values::normal
                                       : b.pick({Values::normal, Values::edges});
      // Variant 4 is long enough for several 2048-element chunks and both threads.
      const Shape shape = variant == 4 ? Shape{3, 2051} : odd_shape(b, int(1 + b.pick(4)));
      const int ix = b.arg(shape, dt, any_view(b), v);
      const UnaryEntry* p = &ue;
      const bool named = b.coin();
      cases.push_back(b.build({"fn:unary", std::string("fn:") + ue.fn,
                               std::string("prim:") + unary_op_name(ue.op), e("UnaryOp", ue.value)},
                              [p, ix, named](const Ins& in) {
                                return Outs{named ? p->f(in[ix]) : unary(p->op, in[ix])};
                              }));
    }
  }
  return cases;
}

std::vector<Case> glu_cases(uint64_t seed) {
  std::vector<Case> cases;
  const std::pair<UnaryOp, const char*> acts[] = {
      {UnaryOp::silu, "silu"}, {UnaryOp::gelu, "gelu"}, {UnaryOp::gelu_tanh, "gelu_tanh"}};
  for (const auto& entry : acts) {
    const UnaryOp act = entry.first;
    const char* name = entry.second;
    for (int variant = 0; variant < 4; ++variant) {
      Builder b(std::string("glu.") + name, seed++);
      Shape s = odd_shape(b, int(1 + b.pick(3)));
      s.back() *= 2;
      const int ix = b.arg(s, float_dtype(b), any_view(b), b.pick({Values::normal, Values::edges}));
      const bool gate_first = variant % 2 == 1;
      const int form = variant / 2;  // glu() or the named wrapper
      Covers cov = {"fn:glu", "prim:glu"};
      if (form == 1) cov.insert(act == UnaryOp::silu ? "fn:swiglu" : "fn:geglu");
      cases.push_back(b.build(cov, [=](const Ins& in) {
        if (form == 1 && act == UnaryOp::silu) return Outs{swiglu(in[ix], gate_first)};
        if (form == 1) return Outs{geglu(in[ix], act == UnaryOp::gelu_tanh)};
        return Outs{glu(in[ix], act, gate_first)};
      }));
    }
  }
  return cases;
}

std::vector<Case> where_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 10; ++variant) {
    Builder b("where", seed++);
    Shape sa = odd_shape(b, int(1 + b.pick(3)));
    Shape sc = broadcast_partner(b, sa);
    Shape sb = sa;
    if (b.coin()) sb = broadcast_partner(b, sa);
    const DType cd = b.pick({DType::boolean, DType::f32, DType::i64});
    const int ic = b.arg(sc, cd, any_view(b), Values::mask);
    const DType da = float_dtype(b);
    const int ia = b.arg(sa, da, any_view(b), Values::edges);
    if (variant % 2 == 0) {
      const int ib = b.arg(sb, b.coin() ? da : float_dtype(b), any_view(b), Values::normal);
      cases.push_back(b.build({"fn:where", "prim:where"}, [=](const Ins& in) {
        return Outs{where(in[ic], in[ia], in[ib])};
      }));
    } else {
      // masked_fill: the mask must broadcast to x's shape (not the other way round).
      const double value = b.pick({0.0, -1e30, 0.5, -3.0});
      cases.push_back(b.build({"fn:masked_fill", "prim:where"}, [=](const Ins& in) {
        const Tensor x = in[ia].expand(broadcast_shapes(in[ia].shape(), in[ic].shape(), "t"));
        return Outs{masked_fill(x, in[ic], value)};
      }));
    }
  }
  return cases;
}

// ---------------------------------------------------------------------------------------------
// Copies and casts.

std::vector<Case> copy_cases(uint64_t seed) {
  std::vector<Case> cases;
  const DType all[] = {DType::f32,     DType::bf16,   DType::f16,    DType::i64,
                       DType::i32,     DType::boolean, DType::f8e4m3, DType::f8e5m2};
  for (DType from : all) {
    for (DType to : all) {
      if (to == from) continue;  // astype returns its input (contiguous/clone below copy)
      Builder b("astype", seed++);
      const Values v = from == DType::boolean ? Values::mask
                       : is_floating(from)    ? b.pick({Values::normal, Values::edges})
                                              : Values::ints;
      // Float edges into integers is undefined in C++ (and torch); keep them finite there.
      const Values vv = (!is_floating(to) && v == Values::edges) ? Values::normal : v;
      const int ix = b.arg(odd_shape(b, int(1 + b.pick(3))), from, any_view(b), vv);
      cases.push_back(b.build({"fn:astype", "prim:copy"},
                              [=](const Ins& in) { return Outs{astype(in[ix], to)}; }, 0));
    }
  }
  for (int variant = 0; variant < 8; ++variant) {
    Builder b("contiguous_clone", seed++);
    const int ix = b.arg(odd_shape(b, int(1 + b.pick(4))), b.pick({DType::f32, DType::bf16, DType::i64}),
                         any_view(b));
    cases.push_back(b.build({"fn:contiguous", "fn:clone", "prim:copy"}, [=](const Ins& in) {
      return Outs{contiguous(in[ix]), clone(in[ix])};
    }, 0));
  }
  return cases;
}

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
      case 0: break;
      case 1: sa.insert(sa.begin(), odd_size(b, 5)); sb.insert(sb.begin(), b.coin() ? 1 : sa[0]); break;
      case 2: sa.insert(sa.begin(), {2, 1}); sb.insert(sb.begin(), 3); break;  // broadcast batch
      case 3:
        if (b.coin()) sa = {K}; else sb = {K};  // 1-D operands
        break;
    }
    const int ia = b.arg(sa, dt, b.pick({View::contiguous, View::transposed, View::offset}));
    const int ib = b.arg(sb, dt, b.pick({View::contiguous, View::transposed, View::offset}));
    cases.push_back(b.build({"fn:matmul", "prim:matmul"},
                            [=](const Ins& in) { return Outs{matmul(in[ia], in[ib])}; }, 4));
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
    cases.push_back(b.build({"fn:linear", "prim:linear"}, [=](const Ins& in) {
      return Outs{linear(in[ix], in[iw], bias ? in[ibias] : Tensor())};
    }, 4));
  }
  // Past the small-GEMM limit (oneDNN in every mode) and with both threads.
  for (DType dt : {DType::f32, DType::bf16}) {
    Builder b("linear.large", seed++);
    const int ix = b.arg({67, 300}, dt);
    const int iw = b.arg({129, 300}, dt);
    const int ib = b.arg({129}, dt);
    cases.push_back(b.build({"fn:linear", "prim:linear"}, [=](const Ins& in) {
      return Outs{linear(in[ix], in[iw], in[ib])};
    }, 8));
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
    const int ix = b.arg({n, cin, h, w}, dt, b.pick({View::contiguous, View::offset, View::strided}));
    const int iw = b.arg({cout, cin / p.groups, kh, kw}, dt);
    const bool bias = b.coin();
    const int ibias = bias ? b.arg({cout}, dt) : -1;
    // The torch-style overload: symmetric padding, no groups or dilation.
    const bool symmetric = variant >= 10 && p.groups == 1 && p.dilation[0] == 1;
    b.note("stride " + shape_of({p.stride[0], p.stride[1]}) + " pad " +
           shape_of({p.padding[0], p.padding[1], p.padding[2], p.padding[3]}) + " dil " +
           shape_of({p.dilation[0], p.dilation[1]}) + " groups " + std::to_string(p.groups) +
           (symmetric ? " symmetric" : ""));
    cases.push_back(b.build({"fn:conv2d", "prim:conv2d"}, [=](const Ins& in) {
      const Tensor bt = bias ? in[ibias] : Tensor();
      if (symmetric) return Outs{conv2d(in[ix], in[iw], bt, p.stride, {p.padding[0], p.padding[2]})};
      return Outs{conv2d(in[ix], in[iw], bt, p)};
    }, 4));
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
    cases.push_back(b.build({"fn:scaled_dot_product_attention", "prim:scaled_dot_product_attention"},
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
    const int ix = b.arg(s, float_dtype(b), any_view(b),
                         variant % 3 == 2 ? Values::edges : Values::normal);
    const int64_t dim = -1 - b.pick(int64_t(s.size()));
    cases.push_back(b.build({"fn:softmax", "prim:softmax"},
                            [=](const Ins& in) { return Outs{softmax(in[ix], dim)}; }, 2));
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
    cases.push_back(b.build({"fn:layer_norm", "prim:layer_norm"}, [=](const Ins& in) {
      return Outs{layer_norm(in[ix], w ? in[iw] : Tensor(), bi ? in[ib] : Tensor(), eps)};
    }, 2));
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
    cases.push_back(b.build({"fn:rms_norm", "prim:rms_norm",
                             style == RmsNormStyle::llama ? e("RmsNormStyle", "llama")
                                                          : e("RmsNormStyle", "diffusers")},
                            [=](const Ins& in) {
                              return Outs{rms_norm(in[ix], w ? in[iw] : Tensor(), 1e-6, style)};
                            },
                            2));
  }
  for (int variant = 0; variant < 10; ++variant) {
    Builder b("group_norm", seed++);
    const DType dt = float_dtype(b);
    const int64_t groups = b.pick({1, 2, 3, 4}), c = groups * b.pick({1, 2, 3});
    Shape s = {b.pick({1, 2}), c};
    for (int64_t i = 0, n = b.pick(3); i < n; ++i) s.push_back(odd_size(b, 17));
    const int ix = b.arg(s, dt, b.pick({View::contiguous, View::strided, View::offset, View::permuted}));
    const bool w = b.coin(), bi = b.coin();
    const int iw = w ? b.arg({c}, dt) : -1, ib = bi ? b.arg({c}, dt) : -1;
    cases.push_back(b.build({"fn:group_norm", "prim:group_norm"}, [=](const Ins& in) {
      return Outs{group_norm(in[ix], groups, w ? in[iw] : Tensor(), bi ? in[ib] : Tensor(), 1e-5)};
    }, 2));
  }
  return cases;
}

std::vector<Case> rope_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 6; ++variant) {
    Builder b("rope_frequencies", seed++);
    const std::vector<int64_t> axes = variant % 2 ? std::vector<int64_t>{8, 12, 12}
                                                  : std::vector<int64_t>{4, 6};
    const int64_t L = odd_size(b, 33);
    Shape s = {L, int64_t(axes.size()) + b.pick(2)};
    if (variant >= 4) s.insert(s.begin(), 2);
    const int ix = b.arg(s, b.pick({DType::f32, DType::i64}), View::contiguous, Values::ids, 64);
    const double theta = b.pick({10000.0, 2000.0});
    cases.push_back(b.build({"fn:rope_frequencies", "prim:rope_frequencies"}, [=](const Ins& in) {
      auto [c, sn] = rope_frequencies(in[ix], axes, theta);
      return Outs{c, sn};
    }, 2));
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
            [=](const Ins& in) { return Outs{apply_rope(in[ix], in[ic], in[is], layout, sd, math)}; },
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
      cases.push_back(b.build({std::string("fn:") + name, std::string("prim:") + name,
                               e("ReduceOp", name)},
                              [=](const Ins& in) {
                                switch (op) {
                                  case ReduceOp::sum: return Outs{sum(in[ix], dim, keep)};
                                  case ReduceOp::mean: return Outs{mean(in[ix], dim, keep)};
                                  case ReduceOp::var: return Outs{var(in[ix], dim, unbiased, keep)};
                                  case ReduceOp::max: return Outs{max(in[ix], dim, keep)};
                                  case ReduceOp::argmax: return Outs{argmax(in[ix], dim, keep)};
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
    const int iw = b.arg({V, D}, float_dtype(b), b.pick({View::contiguous, View::transposed, View::offset}));
    const int ii = b.arg(odd_shape(b, int(1 + b.pick(3)), 9), b.pick({DType::i64, DType::i32}),
                         b.pick({View::contiguous, View::strided, View::broadcast}), Values::ids, V);
    cases.push_back(b.build({"fn:embedding", "prim:embedding"},
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
    cases.push_back(b.build({"fn:timestep_embedding", "prim:timestep_embedding"}, [=](const Ins& in) {
      return Outs{timestep_embedding(in[it], dim, flip, shift, scale, period)};
    }, 2));
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
    cases.push_back(b.build({"fn:concat", "prim:concat"}, [=](const Ins& in) {
      std::vector<Tensor> ts;
      for (int i : idx) ts.push_back(in[i]);
      return Outs{concat(ts, dim)};
    }, 0));
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
    cases.push_back(b.build(cov, [=](const Ins& in) {
      std::vector<Tensor> parts = form == 0 ? split(in[ix], sizes, dim)
                                  : form == 1 ? split(in[ix], size, dim)
                                              : chunk(in[ix], chunks, dim);
      Outs out;
      for (const Tensor& p : parts) {
        out.push_back(p);
        out.push_back(exp(p));
      }
      return out;
    }, 0));
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
    cases.push_back(b.build({"fn:pad", "prim:pad"},
                            [=](const Ins& in) { return Outs{pad(in[ix], pads, value)}; }, 0));
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
    cases.push_back(b.build({"fn:upsample_nearest", "prim:upsample_nearest"},
                            [=](const Ins& in) { return Outs{upsample_nearest(in[ix], factor)}; },
                            0));
  }
  return cases;
}

// Chains of elementwise ops, optionally led by a row norm: what deferred and compiled modes
// fuse into one kernel, so where a fused rounding point could differ from strict eager's.
std::vector<Case> chain_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (int variant = 0; variant < 30; ++variant) {
    Builder b("chain", seed++);
    const DType dt = variant % 3 == 0 ? DType::f32 : variant % 3 == 1 ? DType::bf16 : float_dtype(b);
    Shape s = odd_shape(b, int(2 + b.pick(2)), 65);
    if (variant % 10 == 9) s = {2, 3, 1031};
    Shape row = Shape(s.size(), 1);
    row.back() = s.back();
    const int ix = b.arg(s, dt, b.pick({View::contiguous, View::contiguous, View::offset, View::strided}),
                         b.pick({Values::normal, Values::normal, Values::edges}));
    const int ish = b.arg(row, b.coin() ? dt : DType::f32);  // (1, .., d): a modulation row
    const int isc = b.arg(s, dt);
    const int lead = int(b.pick(3));  // none, layer_norm, rms_norm
    std::vector<int> steps;
    for (int64_t i = 0, n = 2 + b.pick(5); i < n; ++i) steps.push_back(int(b.pick(9)));
    const double k = b.pick({0.5, 1.0, 2.0, -3.0});
    cases.push_back(b.build({}, [=](const Ins& in) {
      Tensor h = in[ix];
      if (lead == 1) h = layer_norm(h, Tensor(), Tensor(), 1e-6);
      if (lead == 2) h = rms_norm(h, Tensor(), 1e-6);
      Outs kept;
      for (size_t i = 0; i < steps.size(); ++i) {
        switch (steps[i]) {
          case 0: h = h * (in[ish] + 1.0) + in[ish]; break;  // modulate
          case 1: h = silu(h); break;
          case 2: h = gelu(h, true); break;
          case 3: h = h + in[isc]; break;  // residual
          case 4: h = h * k; break;
          case 5: h = astype(astype(h, DType::f32), in[ix].dtype()); break;
          case 6: h = tanh(h) - sigmoid(h); break;
          case 7: h = maximum(h, in[isc]) / 3.0; break;
          case 8: kept.push_back(h); h = exp(neg(square(h))); break;  // an output read later too
        }
      }
      kept.push_back(h);
      return kept;
    }));
  }
  return cases;
}

// ---------------------------------------------------------------------------------------------
// The families and the tests.

struct Family {
  const char* name;
  std::vector<Case> (*gen)(uint64_t);
};
const Family kFamilies[] = {
    {"Binary", binary_cases},       {"BinaryScalar", binary_scalar_cases},
    {"Unary", unary_cases},         {"Glu", glu_cases},
    {"Where", where_cases},         {"CopyAstype", copy_cases},
    {"Matmul", matmul_cases},       {"Conv2d", conv_cases},
    {"Attention", attention_cases}, {"Softmax", softmax_cases},
    {"Norm", norm_cases},           {"Rope", rope_cases},
    {"Reduce", reduce_cases},       {"Embedding", embedding_cases},
    {"ShapeOps", shape_cases},      {"Resample", resample_cases},
    {"FusedChains", chain_cases},
};

uint64_t family_seed(size_t i) { return base_seed() + 100000 * (i + 1); }

class BackendConformance : public ::testing::TestWithParam<size_t> {
 protected:
  void TearDown() override {
    set_eager_mode(EagerMode::DeferNever);
    set_async_dispatch(false);
    clear_segment_cache();
  }
};

TEST_P(BackendConformance, EveryCaseOnEveryDeviceInEveryMode) {
  const Family& f = kFamilies[GetParam()];
  const std::vector<Device> devices = available_devices();
  const std::vector<Case> cases = f.gen(family_seed(GetParam()));
  ASSERT_FALSE(cases.empty());
  reset_mode_stats();
  for (const Case& c : cases) {
    run_case(c, devices);
    if (HasFailure() && std::getenv("TESSERA_CONFORMANCE_ALL") == nullptr) break;
  }
  // The modes ran what they claim: one program per case replayed once, deferred segments.
  const ModeStats st = mode_stats();
  EXPECT_EQ(st.program_compiles, int64_t(cases.size() * devices.size()));
  EXPECT_EQ(st.program_cache_hits, int64_t(cases.size() * devices.size()));
  EXPECT_GT(st.segments, 0);
  reset_mode_stats();
  std::string devs;
  for (const Device& d : devices) devs += " " + d.str();
  RecordProperty("cases", int(cases.size()));
  std::printf("[conformance] %s: %zu cases on%s, seed %llu; %lld segments (%lld replayed), "
              "%lld fused kernels\n",
              f.name, cases.size(), devs.c_str(), (unsigned long long)family_seed(GetParam()),
              (long long)st.segments, (long long)st.replayed_segments,
              (long long)st.fused_kernels);
}

// Named "conformance/..." so that `ctest -R conformance` selects the whole suite.
INSTANTIATE_TEST_SUITE_P(conformance, BackendConformance, ::testing::Range(size_t(0), std::size(kFamilies)),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::string(kFamilies[i.param].name);
                         });

// ---------------------------------------------------------------------------------------------
// Coverage: every op function, primitive name and op enum value declared in src/ops/*.h (and
// runtime/elementwise_op.h) is exercised by some case. A new op (or enum value) without a case
// fails here.

std::string strip_comments(const std::string& s) {
  return std::regex_replace(s, std::regex("//[^\n]*"), "");
}

std::set<std::string> declared_ops() {
  const std::filesystem::path dir =
      std::filesystem::path(TESSERA_FIXTURES_DIR).parent_path().parent_path() / "src" / "ops";
  std::set<std::string> names;
  const std::regex fn(
      R"re((?:^|\n)\s*(?:inline\s+)?(?:Tensor|std::vector<Tensor>|std::pair<Tensor,\s*Tensor>)\s+([a-z_0-9]+)\s*\()re");
  const std::regex prim(R"re(name\(\)\s+const\s+override\s*\{\s*return\s+"([a-z_0-9]+)")re");
  const std::regex en(R"(enum\s+class\s+(\w+)(?:\s*:\s*\w+)?\s*\{([^}]*)\})");
  // The op enums live in runtime/elementwise_op.h (they are the fused kernel's instruction set).
  std::vector<std::filesystem::path> headers = {dir.parent_path() / "runtime" / "elementwise_op.h"};
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".h") headers.push_back(entry.path());
  for (const auto& path : headers) {
    std::ifstream is(path);
    const std::string text =
        strip_comments(std::string(std::istreambuf_iterator<char>(is), {}));
    for (std::sregex_iterator it(text.begin(), text.end(), fn), end; it != end; ++it)
      names.insert("fn:" + (*it)[1].str());
    for (std::sregex_iterator it(text.begin(), text.end(), prim), end; it != end; ++it)
      names.insert("prim:" + (*it)[1].str());
    for (std::sregex_iterator it(text.begin(), text.end(), en), end; it != end; ++it) {
      std::stringstream body((*it)[2].str());
      for (std::string v; std::getline(body, v, ',');) {
        v = std::regex_replace(v, std::regex(R"(\s|=.*)"), "");
        if (!v.empty()) names.insert("enum:" + (*it)[1].str() + "::" + v);
      }
    }
  }
  // Primitives whose name() depends on an enum attribute: every value the parse counted.
  auto count = [&](const std::string& type) {
    return std::count_if(names.begin(), names.end(), [&](const std::string& n) {
      return n.rfind("enum:" + type + "::", 0) == 0;
    });
  };
  for (int64_t v = 0; v < count("BinaryOp"); ++v)
    names.insert(std::string("prim:") + Binary(BinaryOp(v)).name());
  for (int64_t v = 0; v < count("UnaryOp"); ++v)
    names.insert(std::string("prim:") + Unary(UnaryOp(v)).name());
  for (int64_t v = 0; v < count("ReduceOp"); ++v)
    names.insert(std::string("prim:") + Reduce(ReduceOp(v), 0, false).name());
  return names;
}

// Parameterised only to share the "conformance/" prefix.
class BackendConformanceCoverage : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(conformance, BackendConformanceCoverage, ::testing::Values(0));

TEST_P(BackendConformanceCoverage, EveryOpFunctionPrimitiveAndEnumValueHasACase) {
  const std::set<std::string> declared = declared_ops();
  // The parse found the ops (a broken regex must not make this test vacuous).
  for (const char* must : {"fn:matmul", "fn:scaled_dot_product_attention", "fn:rope_frequencies",
                           "prim:group_norm", "enum:UnaryOp::quick_gelu", "enum:RopeMath::fp32"})
    ASSERT_TRUE(declared.count(must)) << must << " not found in src/ops/*.h";
  std::set<std::string> covered;
  size_t n = 0;
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    for (const Case& c : kFamilies[i].gen(family_seed(i))) {
      covered.insert(c.covers.begin(), c.covers.end());
      ++n;
    }
  std::string missing;
  for (const std::string& d : declared)
    if (!covered.count(d)) missing += " " + d;
  EXPECT_TRUE(missing.empty()) << "declared in src/ops/*.h but exercised by no conformance case:"
                               << missing;
  std::string stale;
  for (const std::string& c : covered)
    if (!declared.count(c)) stale += " " + c;
  EXPECT_TRUE(stale.empty()) << "cases claim ops that src/ops/*.h does not declare:" << stale;
  std::printf("[conformance] %zu cases cover %zu declared ops, primitives and enum values\n", n,
              declared.size());
}

// A case that claims a primitive must dispatch at least one op (its claim is not just a label).
TEST_P(BackendConformanceCoverage, CasesThatClaimAPrimitiveDispatchOps) {
  set_eager_mode(EagerMode::DeferNever);
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    for (const Case& c : kFamilies[i].gen(family_seed(i))) {
      const bool claims = std::any_of(c.covers.begin(), c.covers.end(),
                                      [](const std::string& s) { return s.rfind("prim:", 0) == 0; });
      if (!claims) continue;
      reset_dispatch_stats();
      c.fn(c.inputs);
      EXPECT_GT(dispatch_stats().ops_dispatched, 0) << c.name;
    }
}

}  // namespace
}  // namespace tessera::conformance
