#include "backends/xla/xla_lowering.h"

#include <cmath>
#include <cstring>

#include "backends/xla/lowering_util.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/reduce.h"
#include "ops/softmax.h"

// Elementwise ops, dtype conversions, matrix products, softmax and reductions here; norms,
// RoPE, attention, embeddings, shape ops and convolution in xla_lowering_nn.cpp.
namespace tessera::xla {
namespace {

// Eigen's rational approximation of erf on [-4, 4] (max error 7e-8 in f32): StableHLO has no
// erf op, and XLA expands chlo.erf the same way.
Val erf_f32(Hlo& h, const Val& x) {
  const Shape& s = x.shape;
  auto c = [&](double v) { return h.splat(v, s, "f32"); };
  Val xc = h.op("clamp", {c(-4.0), x, c(4.0)}, "", s, "f32");
  Val x2 = h.binary("multiply", xc, xc);
  const double a[] = {-2.72614225801306e-10, 2.77068142495902e-08,  -2.10102402082508e-06,
                      -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                      -1.60960333262415e-02};
  const double b[] = {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                      -7.37332916720468e-03, -1.42647390514189e-02};
  Val p = c(a[0]);
  for (int i = 1; i < 7; ++i) p = h.binary("add", h.binary("multiply", p, x2), c(a[i]));
  Val q = c(b[0]);
  for (int i = 1; i < 5; ++i) q = h.binary("add", h.binary("multiply", q, x2), c(b[i]));
  return h.binary("divide", h.binary("multiply", xc, p), q);
}

Val sigmoid_f32(Hlo& h, const Val& x) {
  return h.unary("logistic", x);
}

Val is_nan(Hlo& h, const Val& x) {
  return h.compare("NE", x, x);
}

// max/min that propagate NaN as torch does (the CPU plugin's maximum does not).
Val nan_minmax(Hlo& h, const char* op, const Val& a, const Val& b) {
  Val r = h.binary(op, a, b);
  Val any = h.op("or", {is_nan(h, a), is_nan(h, b)}, "", a.shape, "i1");
  return h.select(any, h.binary("add", a, b), r);
}

// torch's vectorised exp (and the CPU kernel) clamps x to 88.3762626647949 below overflow
// (88.72283935546875) and returns 0 under -87.3365478515625; the same here. Near the top,
// exp(x/2)^2, as the plugin's exp loses accuracy there.
Val exp_f32(Hlo& h, const Val& x) {
  const Shape& s = x.shape;
  auto c = [&](double v) { return h.splat(v, s, "f32"); };
  Val xc = h.select(h.compare("GT", x, c(88.3762626647949)), c(88.3762626647949), x);
  Val half = h.unary("exponential", h.binary("multiply", xc, c(0.5)));
  Val e = h.select(h.compare("GT", xc, c(80.0)), h.binary("multiply", half, half),
                   h.unary("exponential", xc));
  e = h.select(h.compare("GT", x, c(88.72283935546875)), c(INFINITY), e);
  return h.select(h.compare("LT", x, c(-87.3365478515625)), c(0.0), e);
}

// The CPU plugin treats subnormal inputs as zero. sqrt, rsqrt and log of a subnormal x are
// computed from its bits: x = m * 2^-149 with m the integer significand (exact in f32).
Val subnormal_safe(Hlo& h, UnaryOp op, const Val& x) {
  const Shape& s = x.shape;
  auto c = [&](double v) { return h.splat(v, s, "f32"); };
  Val bits = h.bitcast(x, s, "i32");
  Val mag = h.op("and", {bits, h.splat(2147483647.0, s, "i32")}, "", s, "i32");
  Val sub = h.op("and",
                 {h.compare("LT", mag, h.splat(8388608.0, s, "i32")),
                  h.compare("NE", mag, h.splat(0.0, s, "i32"))},
                 "", s, "i1");
  Val m = h.convert(mag, "f32");
  Val normal, scaled;
  if (op == UnaryOp::sqrt) {
    normal = h.unary("sqrt", x);
    scaled = h.binary("multiply", h.unary("sqrt", m), c(std::ldexp(M_SQRT1_2, -74)));
  } else if (op == UnaryOp::rsqrt) {
    normal = h.unary("rsqrt", x);
    scaled = h.binary("multiply", h.unary("rsqrt", m), c(std::ldexp(M_SQRT2, 74)));
  } else {
    normal = h.unary("log", x);
    scaled = h.binary("subtract", h.unary("log", m), c(149.0 * M_LN2));
  }
  // A negative subnormal has no real root or log: NaN, as for any negative input.
  Val neg = h.compare("LT", bits, h.splat(0.0, s, "i32"));
  scaled = h.select(neg, c(NAN), scaled);
  return h.select(sub, scaled, normal);
}

// One unary op in f32.
bool unary_f32(Hlo& h, UnaryOp op, const Val& x, Val& r) {
  const Shape& s = x.shape;
  auto c = [&](double v) { return h.splat(v, s, "f32"); };
  switch (op) {
    case UnaryOp::neg:
      r = h.unary("negate", x);
      return true;
    case UnaryOp::abs:
      r = h.unary("abs", x);
      return true;
    case UnaryOp::exp:
      r = exp_f32(h, x);
      return true;
    case UnaryOp::log:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt:
      r = subnormal_safe(h, op, x);
      return true;
    case UnaryOp::tanh:
      r = h.unary("tanh", x);
      return true;
    case UnaryOp::sigmoid:
      r = sigmoid_f32(h, x);
      return true;
    case UnaryOp::sin:
      r = h.unary("sine", x);
      return true;
    case UnaryOp::cos:
      r = h.unary("cosine", x);
      return true;
    case UnaryOp::square:
      r = h.binary("multiply", x, x);
      return true;
    case UnaryOp::silu:
      r = h.binary("multiply", x, sigmoid_f32(h, x));
      return true;
    case UnaryOp::gelu: {
      Val e = erf_f32(h, h.binary("multiply", x, c(M_SQRT1_2)));
      r = h.binary("multiply", h.binary("multiply", x, c(0.5)), h.binary("add", e, c(1.0)));
      return true;
    }
    case UnaryOp::gelu_tanh: {
      Val x3 = h.binary("multiply", h.binary("multiply", x, x), x);
      Val in = h.binary("multiply", c(0.7978845608028654),
                        h.binary("add", x, h.binary("multiply", c(0.044715), x3)));
      r = h.binary("multiply", h.binary("multiply", x, c(0.5)),
                   h.binary("add", h.unary("tanh", in), c(1.0)));
      return true;
    }
    case UnaryOp::quick_gelu:
      r = h.binary("multiply", x, sigmoid_f32(h, h.binary("multiply", x, c(1.702))));
      return true;
    case UnaryOp::relu:
      r = nan_minmax(h, "maximum", x, c(0.0));
      return true;
  }
  return false;
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "subtract";
    case BinaryOp::mul:
      return "multiply";
    case BinaryOp::div:
      return "divide";
    case BinaryOp::maximum:
      return "maximum";
    case BinaryOp::minimum:
      return "minimum";
    case BinaryOp::pow:
      return "power";
  }
  return "?";
}

// a op b of one computation type: f32 for a floating output, the output's type for integers.
bool binary_values(Hlo& h, BinaryOp op, Val a, DType ad, Val b, DType bd, DType out, Val& r) {
  if (is_float(out)) {
    a = to_f32(h, a, ad);
    b = to_f32(h, b, bd);
    Val v = op == BinaryOp::maximum || op == BinaryOp::minimum
                ? nan_minmax(h, binary_name(op), a, b)
                : h.binary(binary_name(op), a, b);
    r = convert_dtype(h, v, DType::f32, out);
    return true;
  }
  if (!is_intlike(out) || op == BinaryOp::div || op == BinaryOp::pow) return false;
  a = convert_dtype(h, a, ad, out);
  b = convert_dtype(h, b, bd, out);
  r = h.binary(binary_name(op), a, b);
  return true;
}

bool lower_binary(Hlo& h, const Binary& p, const std::vector<Val>& in, const std::vector<DType>& dt,
                  const TensorSpec& o, Val& r) {
  return binary_values(h, p.op(), h.broadcast_to(in[0], o.shape), dt[0],
                       h.broadcast_to(in[1], o.shape), dt[1], o.dtype, r);
}

bool lower_binary_scalar(Hlo& h, const BinaryScalar& p, const Val& x, DType xd, const TensorSpec& o,
                         Val& r) {
  double s = p.scalar();
  const bool reduced = (o.dtype == DType::bf16 || o.dtype == DType::f16) && xd == o.dtype;
  const BinaryOp op = p.op();
  if (!is_float(o.dtype)) {
    if (!is_intlike(o.dtype) || s != std::floor(s)) return false;
    Val sv = h.splat(s, x.shape, element_type(o.dtype));
    return p.scalar_first() ? binary_values(h, op, sv, o.dtype, x, xd, o.dtype, r)
                            : binary_values(h, op, x, xd, sv, o.dtype, o.dtype, r);
  }
  Val sv = h.splat(s, x.shape, "f32");  // float(s)
  // torch rounds a Python scalar to a bf16/f16 tensor's dtype for add, sub and pow.
  if (reduced && (op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::pow))
    sv = h.convert(h.convert(sv, element_type(o.dtype)), "f32");
  return p.scalar_first() ? binary_values(h, op, sv, DType::f32, x, xd, o.dtype, r)
                          : binary_values(h, op, x, xd, sv, DType::f32, o.dtype, r);
}

bool lower_unary(Hlo& h, const Unary& p, const Val& x, DType xd, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype)) {
    if (!is_intlike(o.dtype)) return false;
    Val xi = convert_dtype(h, x, xd, o.dtype);
    if (p.op() == UnaryOp::neg)
      r = h.unary("negate", xi);
    else if (p.op() == UnaryOp::abs)
      r = h.unary("abs", xi);
    else if (p.op() == UnaryOp::square)
      r = h.binary("multiply", xi, xi);
    else if (p.op() == UnaryOp::relu)
      r = h.binary("maximum", xi, h.splat(0.0, xi.shape, xi.et));
    else
      return false;
    return true;
  }
  Val f;
  if (!unary_f32(h, p.op(), to_f32(h, x, xd), f)) return false;
  r = convert_dtype(h, f, DType::f32, o.dtype);
  return true;
}

bool lower_glu(Hlo& h, const Glu& p, const Val& x, DType xd, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || x.shape.empty()) return false;
  const size_t last = x.shape.size() - 1;
  const int64_t half = x.shape[last] / 2;
  std::vector<int64_t> start(x.shape.size(), 0), mid(x.shape.begin(), x.shape.end());
  mid[last] = half;
  std::vector<int64_t> start2(x.shape.size(), 0);
  start2[last] = half;
  Val first = to_f32(h, h.slice(x, start, mid), xd);
  Val second = to_f32(h, h.slice(x, start2, x.shape), xd);
  Val gate = p.gate_first() ? first : second, value = p.gate_first() ? second : first;
  Val act;
  if (!unary_f32(h, p.act(), gate, act)) return false;
  act = h.convert(h.convert(act, element_type(o.dtype)), "f32");  // torch stores act(gate)
  r = convert_dtype(h, h.binary("multiply", value, act), DType::f32, o.dtype);
  return true;
}

bool lower_where(Hlo& h, const std::vector<Val>& in, const std::vector<DType>& dt,
                 const TensorSpec& o, Val& r) {
  Val c = convert_dtype(h, h.broadcast_to(in[0], o.shape), dt[0], DType::boolean);
  // The CPU loads a and b to f32 and stores the output dtype.
  const DType via = is_float(o.dtype) ? DType::f32 : o.dtype;
  Val a = convert_dtype(h, h.broadcast_to(in[1], o.shape), dt[1], via);
  Val b = convert_dtype(h, h.broadcast_to(in[2], o.shape), dt[2], via);
  r = convert_dtype(h, h.select(c, a, b), via, o.dtype);
  return true;
}

// a[..., M, K] @ b[..., K, N]: batch dims broadcast; accumulates in f32, rounds once.
bool lower_matmul(Hlo& h, const std::vector<Val>& in, const std::vector<DType>& dt,
                  const TensorSpec& o, Val& r) {
  if (in[0].shape.size() < 2 || in[1].shape.size() < 2 || !is_float(o.dtype)) return false;
  const size_t nb = o.shape.size() - 2;
  Shape as(o.shape.begin(), o.shape.end() - 2), bs = as;
  as.push_back(in[0].shape[in[0].shape.size() - 2]);
  as.push_back(in[0].shape.back());
  bs.push_back(in[1].shape[in[1].shape.size() - 2]);
  bs.push_back(in[1].shape.back());
  Val a = to_f32(h, h.broadcast_to(in[0], as), dt[0]);
  Val b = to_f32(h, h.broadcast_to(in[1], bs), dt[1]);
  std::vector<int64_t> batch;
  for (size_t i = 0; i < nb; ++i) batch.push_back(int64_t(i));
  Val d = h.dot_general(a, b, batch, batch, {int64_t(nb + 1)}, {int64_t(nb)}, o.shape);
  r = convert_dtype(h, d, DType::f32, o.dtype);
  return true;
}

bool lower_linear(Hlo& h, const Linear& p, const std::vector<Val>& in, const std::vector<DType>& dt,
                  const TensorSpec& o, Val& r) {
  if (in[0].shape.empty() || in[1].shape.size() != 2 || !is_float(o.dtype)) return false;
  Val x = to_f32(h, in[0], dt[0]);
  Val w = to_f32(h, in[1], dt[1]);
  Val d = h.dot_general(x, w, {}, {}, {int64_t(x.shape.size() - 1)}, {1}, o.shape);
  if (p.has_bias()) d = h.binary("add", d, h.broadcast_to(to_f32(h, in[2], dt[2]), o.shape));
  r = convert_dtype(h, d, DType::f32, o.dtype);
  return true;
}

bool lower_softmax(Hlo& h, const Softmax& p, const Val& x, DType xd, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || x.shape.empty()) return false;
  const int64_t dim = p.dim();
  Val f = to_f32(h, x, xd);
  Shape kept = f.shape;
  kept.erase(kept.begin() + dim);
  std::vector<int64_t> bdims;
  for (size_t i = 0; i < f.shape.size(); ++i)
    if (int64_t(i) != dim) bdims.push_back(int64_t(i));
  Val m = h.broadcast_in_dim(h.reduce(f, {dim}, "maximum", -INFINITY), f.shape, bdims);
  Val e = h.unary("exponential", h.binary("subtract", f, m));
  Val s = h.broadcast_in_dim(h.reduce(e, {dim}, "add", 0.0), f.shape, bdims);
  r = convert_dtype(h, h.binary("divide", e, s), DType::f32, o.dtype);
  return true;
}

bool lower_reduce(Hlo& h, const Reduce& p, const Val& x, DType xd, const TensorSpec& o, Val& r) {
  const int64_t dim = p.dim();
  if (x.shape.empty()) return false;
  const double n = double(x.shape[size_t(dim)]);
  Shape kept = x.shape;
  kept.erase(kept.begin() + dim);
  std::vector<int64_t> bdims;
  for (size_t i = 0; i < x.shape.size(); ++i)
    if (int64_t(i) != dim) bdims.push_back(int64_t(i));
  const bool ints = is_intlike(xd) || xd == DType::boolean;
  if (p.op() == ReduceOp::argmax) {
    if ((!is_float(xd) && !ints) || o.dtype != DType::i64) return false;
    if (ints) {  // the first index of the maximum, in the integers themselves
      Val xi = convert_dtype(h, x, xd, DType::i64);
      Val m = h.broadcast_in_dim(h.reduce(xi, {dim}, "maximum", -9223372036854775808.0), xi.shape,
                                 bdims);
      Val idx = h.iota(xi.shape, dim, "i64");
      Val cand = h.select(h.compare("EQ", xi, m), idx,
                          h.splat(double(x.shape[size_t(dim)]), xi.shape, "i64"));
      r = h.reshape(h.reduce(cand, {dim}, "minimum", double(INT64_MAX / 2)), o.shape);
      return true;
    }
    Val f = to_f32(h, x, xd);
    // The first index of the maximum; a NaN is the maximum (torch).
    Val nan = h.compare("NE", f, f);
    Val m = h.broadcast_in_dim(h.reduce(f, {dim}, "maximum", -INFINITY), f.shape, bdims);
    Val hit = h.op("or", {h.compare("EQ", f, m), nan}, "", f.shape, "i1");
    Val idx = h.iota(f.shape, dim, "i64");
    Val cand = h.select(hit, idx, h.splat(double(x.shape[size_t(dim)]), f.shape, "i64"));
    r = h.reshape(h.reduce(cand, {dim}, "minimum", double(INT64_MAX / 2)), o.shape);
    return true;
  }
  if (ints && is_intlike(o.dtype) &&
      (p.op() == ReduceOp::sum || p.op() == ReduceOp::max)) {  // exact, in the output's type
    Val xi = convert_dtype(h, x, xd, o.dtype);
    Val red = p.op() == ReduceOp::sum
                  ? h.reduce(xi, {dim}, "add", 0.0)
                  : h.reduce(xi, {dim}, "maximum",
                             o.dtype == DType::i32 ? -2147483648.0 : -9223372036854775808.0);
    r = h.reshape(red, o.shape);
    return true;
  }
  if (!is_float(o.dtype)) return false;
  Val f = to_f32(h, x, xd);
  Val red;
  switch (p.op()) {
    case ReduceOp::sum:
      red = h.reduce(f, {dim}, "add", 0.0);
      break;
    case ReduceOp::mean:
      red = h.binary("divide", h.reduce(f, {dim}, "add", 0.0), h.splat(n, kept, "f32"));
      break;
    case ReduceOp::max: {  // NaN propagates (torch.amax)
      Val nans = h.reduce(
          h.select(is_nan(h, f), h.splat(1.0, f.shape, "f32"), h.splat(0.0, f.shape, "f32")), {dim},
          "add", 0.0);
      red = h.select(h.compare("GT", nans, h.splat(0.0, kept, "f32")), h.splat(NAN, kept, "f32"),
                     h.reduce(f, {dim}, "maximum", -INFINITY));
      break;
    }
    case ReduceOp::var: {
      Val mean = h.binary("divide", h.reduce(f, {dim}, "add", 0.0), h.splat(n, kept, "f32"));
      Val dlt = h.binary("subtract", f, h.broadcast_in_dim(mean, f.shape, bdims));
      Val ss = h.reduce(h.binary("multiply", dlt, dlt), {dim}, "add", 0.0);
      red = h.binary("divide", ss, h.splat(p.unbiased() ? n - 1 : n, kept, "f32"));
      break;
    }
    default:
      return false;
  }
  r = h.reshape(convert_dtype(h, red, DType::f32, o.dtype), o.shape);
  return true;
}

}  // namespace

Val convert_dtype(Hlo& h, const Val& x, DType from, DType to) {
  if (from == to) return x;
  const std::string et = element_type(to);
  if (to == DType::boolean) return h.compare("NE", x, h.splat(0.0, x.shape, x.et));
  if (from == DType::boolean) {
    // i1 -> 0/1 of the target type.
    return h.select(x, h.splat(1.0, x.shape, et), h.splat(0.0, x.shape, et));
  }
  if (to == DType::f8e4m3 || to == DType::f8e5m2) {
    Val f = from == DType::f32 ? x : convert_dtype(h, x, from, DType::f32);
    if (to == DType::f8e4m3) {
      // No infinity in e4m3fn: finite overflow and +-inf saturate to +-448.
      Val hi = h.splat(448.0, x.shape, "f32"), lo = h.splat(-448.0, x.shape, "f32");
      f = h.select(h.compare("GT", f, hi), hi, f);
      f = h.select(h.compare("LT", f, lo), lo, f);
    }
    // NaN is 0x7f with the input's sign, as tessera's (and torch's) conversion writes it.
    Val bits = h.bitcast(h.convert(f, et), x.shape, "ui8");
    Val neg = h.compare("LT", h.bitcast(f, x.shape, "i32"), h.splat(0.0, x.shape, "i32"));
    Val nan_bits = h.select(neg, h.splat(255.0, x.shape, "ui8"), h.splat(127.0, x.shape, "ui8"));
    bits = h.select(h.compare("NE", f, f), nan_bits, bits);
    return h.bitcast(bits, x.shape, et);
  }
  if (is_float(from) && is_float(to) && from != DType::f32 && to != DType::f32)
    return h.convert(h.convert(x, "f32"), et);  // torch converts through f32
  return h.convert(x, et);
}

bool lower(Hlo& h, const Primitive& p, const std::vector<Val>& in, const std::vector<DType>& dt,
           const std::vector<TensorSpec>& outs, std::vector<Val>& results) {
  bool matched = false;
  const bool ok = lower_nn(h, p, in, dt, outs, results, matched);
  if (matched) return ok;
  if (outs.size() != 1) return false;
  const TensorSpec& o = outs[0];
  Val r;
  bool done = false;
  if (auto* b = dynamic_cast<const Binary*>(&p))
    done = lower_binary(h, *b, in, dt, o, r);
  else if (auto* s = dynamic_cast<const BinaryScalar*>(&p))
    done = lower_binary_scalar(h, *s, in[0], dt[0], o, r);
  else if (auto* u = dynamic_cast<const Unary*>(&p))
    done = lower_unary(h, *u, in[0], dt[0], o, r);
  else if (auto* g = dynamic_cast<const Glu*>(&p))
    done = lower_glu(h, *g, in[0], dt[0], o, r);
  else if (dynamic_cast<const Where*>(&p))
    done = lower_where(h, in, dt, o, r);
  else if (dynamic_cast<const Copy*>(&p)) {
    r = convert_dtype(h, in[0], dt[0], o.dtype);
    done = true;
  } else if (dynamic_cast<const Matmul*>(&p))
    done = lower_matmul(h, in, dt, o, r);
  else if (auto* l = dynamic_cast<const Linear*>(&p))
    done = lower_linear(h, *l, in, dt, o, r);
  else if (auto* sm = dynamic_cast<const Softmax*>(&p))
    done = lower_softmax(h, *sm, in[0], dt[0], o, r);
  else if (auto* rd = dynamic_cast<const Reduce*>(&p))
    done = lower_reduce(h, *rd, in[0], dt[0], o, r);
  if (!done) return false;
  results.push_back(h.reshape(r, o.shape));
  return true;
}

}  // namespace tessera::xla
