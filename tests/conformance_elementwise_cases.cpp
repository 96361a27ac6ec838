// Conformance cases (tests/backend_conformance_test.cpp): elementwise ops, copies and casts,
// and fused chains.
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
static Shape broadcast_partner(Builder& b, Shape& a) {
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
        case 0:
          da = db = DType::f32;
          break;
        case 1:
          da = db = DType::bf16;
          break;
        case 2:
          da = db = DType::f16;
          break;
        case 3:
          da = DType::bf16, db = b.pick({DType::f32, DType::f16});
          break;  // promotes
        case 4:
          da = b.pick({DType::i32, DType::i64}), db = b.pick({DType::i64, DType::f32});
          break;
        default:
          da = float_dtype(b), db = da;
          break;
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
      cases.push_back(b.build({"fn:binary", std::string("fn:") + be.fn,
                               std::string("prim:") + be.fn, e("BinaryOp", be.fn)},
                              [p, ia, ib, named](const Ins& in) {
                                return Outs{named ? p->tt(in[ia], in[ib])
                                                  : binary(p->op, in[ia], in[ib])};
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
      const DType dt = variant < 3
                           ? std::array{DType::f32, DType::bf16, DType::f16}[size_t(variant)]
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
    cases.push_back(b.build(
        {"fn:sub", "fn:div", "fn:add", "fn:mul", "prim:sub", "prim:div"}, [ix](const Ins& in) {
          const Tensor& x = in[ix];
          return Outs{sub(2.5, x), div(3.0, x), 1.5 + x, 0.25 * x, 2.0 - x, 4.0 / x};
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
    {UnaryOp::quick_gelu, "quick_gelu", "quick_gelu",
     [](const Tensor& x) { return quick_gelu(x); }},
    {UnaryOp::relu, "relu", "relu", [](const Tensor& x) { return relu(x); }},
};

std::vector<Case> unary_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (const UnaryEntry& ue : kUnary) {
    for (int variant = 0; variant < 5; ++variant) {
      Builder b(std::string("unary.") + ue.value, seed++);
      const DType dt = variant < 3
                           ? std::array{DType::f32, DType::bf16, DType::f16}[size_t(variant)]
                       : variant == 3 ? b.pick({DType::i32, DType::i64})
                                      : float_dtype(b);
      const Values v = !is_floating(dt) ? Values::ints
                       : variant == 4   ? Values::normal
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
      cases.push_back(b.build({"fn:where", "prim:where"},
                              [=](const Ins& in) { return Outs{where(in[ic], in[ia], in[ib])}; }));
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
  const DType all[] = {DType::f32, DType::bf16,    DType::f16,    DType::i64,
                       DType::i32, DType::boolean, DType::f8e4m3, DType::f8e5m2};
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
      cases.push_back(b.build(
          {"fn:astype", "prim:copy"}, [=](const Ins& in) { return Outs{astype(in[ix], to)}; }, 0));
    }
  }
  for (int variant = 0; variant < 8; ++variant) {
    Builder b("contiguous_clone", seed++);
    const int ix = b.arg(odd_shape(b, int(1 + b.pick(4))),
                         b.pick({DType::f32, DType::bf16, DType::i64}), any_view(b));
    cases.push_back(b.build(
        {"fn:contiguous", "fn:clone", "prim:copy"},
        [=](const Ins& in) {
          return Outs{contiguous(in[ix]), clone(in[ix])};
        },
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
    const DType dt = variant % 3 == 0   ? DType::f32
                     : variant % 3 == 1 ? DType::bf16
                                        : float_dtype(b);
    Shape s = odd_shape(b, int(2 + b.pick(2)), 65);
    if (variant % 10 == 9) s = {2, 3, 1031};
    Shape row = Shape(s.size(), 1);
    row.back() = s.back();
    const int ix =
        b.arg(s, dt, b.pick({View::contiguous, View::contiguous, View::offset, View::strided}),
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
          case 0:
            h = h * (in[ish] + 1.0) + in[ish];
            break;  // modulate
          case 1:
            h = silu(h);
            break;
          case 2:
            h = gelu(h, true);
            break;
          case 3:
            h = h + in[isc];
            break;  // residual
          case 4:
            h = h * k;
            break;
          case 5:
            h = astype(astype(h, DType::f32), in[ix].dtype());
            break;
          case 6:
            h = tanh(h) - sigmoid(h);
            break;
          case 7:
            h = maximum(h, in[isc]) / 3.0;
            break;
          case 8:
            kept.push_back(h);
            h = exp(neg(square(h)));
            break;  // an output read later too
        }
      }
      kept.push_back(h);
      return kept;
    }));
  }
  return cases;
}

}  // namespace tessera::conformance
