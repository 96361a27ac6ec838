#include "backends/xla/xla_lowering.h"

#include <cmath>
#include <cstring>

#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/copy.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/resample.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/reduce.h"
#include "ops/softmax.h"

namespace tessera::xla {
namespace {

bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f8e4m3 ||
         t == DType::f8e5m2;
}
bool is_intlike(DType t) {
  return t == DType::i64 || t == DType::i32;
}

// x as f32 (floats widen exactly; integers and bool convert as torch's .float()).
Val to_f32(Hlo& h, const Val& x, DType from) {
  return convert_dtype(h, x, from, DType::f32);
}

// Eigen's rational approximation of erf on [-4, 4] (max error 7e-8 in f32): StableHLO has no
// erf op, and XLA expands chlo.erf the same way.
Val erf_f32(Hlo& h, const Val& x) {
  const Shape& s = x.shape;
  auto c = [&](double v) { return h.splat(v, s, "f32"); };
  Val xc = h.op("clamp", {c(-4.0), x, c(4.0)}, "", s, "f32");
  Val x2 = h.binary("multiply", xc, xc);
  const double a[] = {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
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
  Val sub = h.op("and", {h.compare("LT", mag, h.splat(8388608.0, s, "i32")),
                         h.compare("NE", mag, h.splat(0.0, s, "i32"))}, "", s, "i1");
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
    case UnaryOp::neg: r = h.unary("negate", x); return true;
    case UnaryOp::abs: r = h.unary("abs", x); return true;
    case UnaryOp::exp: r = exp_f32(h, x); return true;
    case UnaryOp::log:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt: r = subnormal_safe(h, op, x); return true;
    case UnaryOp::tanh: r = h.unary("tanh", x); return true;
    case UnaryOp::sigmoid: r = sigmoid_f32(h, x); return true;
    case UnaryOp::sin: r = h.unary("sine", x); return true;
    case UnaryOp::cos: r = h.unary("cosine", x); return true;
    case UnaryOp::square: r = h.binary("multiply", x, x); return true;
    case UnaryOp::silu: r = h.binary("multiply", x, sigmoid_f32(h, x)); return true;
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
    case UnaryOp::relu: r = nan_minmax(h, "maximum", x, c(0.0)); return true;
  }
  return false;
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "subtract";
    case BinaryOp::mul: return "multiply";
    case BinaryOp::div: return "divide";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::pow: return "power";
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

bool lower_binary(Hlo& h, const Binary& p, const std::vector<Val>& in,
                  const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  return binary_values(h, p.op(), h.broadcast_to(in[0], o.shape), dt[0],
                       h.broadcast_to(in[1], o.shape), dt[1], o.dtype, r);
}

bool lower_binary_scalar(Hlo& h, const BinaryScalar& p, const Val& x, DType xd,
                         const TensorSpec& o, Val& r) {
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
    if (p.op() == UnaryOp::neg) r = h.unary("negate", xi);
    else if (p.op() == UnaryOp::abs) r = h.unary("abs", xi);
    else if (p.op() == UnaryOp::square) r = h.binary("multiply", xi, xi);
    else if (p.op() == UnaryOp::relu) r = h.binary("maximum", xi, h.splat(0.0, xi.shape, xi.et));
    else return false;
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

bool lower_linear(Hlo& h, const Linear& p, const std::vector<Val>& in,
                  const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
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
      Val m = h.broadcast_in_dim(h.reduce(xi, {dim}, "maximum", -9223372036854775808.0),
                                 xi.shape, bdims);
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
    Val red = p.op() == ReduceOp::sum ? h.reduce(xi, {dim}, "add", 0.0)
                                      : h.reduce(xi, {dim}, "maximum",
                                                 o.dtype == DType::i32 ? -2147483648.0
                                                                          : -9223372036854775808.0);
    r = h.reshape(red, o.shape);
    return true;
  }
  if (!is_float(o.dtype)) return false;
  Val f = to_f32(h, x, xd);
  Val red;
  switch (p.op()) {
    case ReduceOp::sum: red = h.reduce(f, {dim}, "add", 0.0); break;
    case ReduceOp::mean:
      red = h.binary("divide", h.reduce(f, {dim}, "add", 0.0), h.splat(n, kept, "f32"));
      break;
    case ReduceOp::max: {  // NaN propagates (torch.amax)
      Val nans = h.reduce(h.select(is_nan(h, f), h.splat(1.0, f.shape, "f32"),
                                   h.splat(0.0, f.shape, "f32")),
                          {dim}, "add", 0.0);
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
    default: return false;
  }
  r = h.reshape(convert_dtype(h, red, DType::f32, o.dtype), o.shape);
  return true;
}


// Rounds an f32 value to dtype t and back (torch storing an intermediate in t).
Val round_through(Hlo& h, const Val& x, DType t) {
  if (t == DType::f32) return x;
  return h.convert(h.convert(x, element_type(t)), "f32");
}

// Mean over the last `n` elements of each row: x is [rows..., d] in f32.
Val row_mean(Hlo& h, const Val& x, int64_t last) {
  Shape kept(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> bd;
  for (size_t i = 0; i + 1 < x.shape.size(); ++i) bd.push_back(int64_t(i));
  Val s = h.reduce(x, {last}, "add", 0.0);
  s = h.binary("divide", s, h.splat(double(x.shape[size_t(last)]), kept, "f32"));
  return h.broadcast_in_dim(s, x.shape, bd);
}

bool lower_layer_norm(Hlo& h, const LayerNorm& p, const std::vector<Val>& in,
                      const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || in[0].shape.empty()) return false;
  Val x = to_f32(h, in[0], dt[0]);
  const int64_t last = int64_t(x.shape.size()) - 1;
  Val mu = row_mean(h, x, last);
  Val dx = h.binary("subtract", x, mu);
  Val var = row_mean(h, h.binary("multiply", dx, dx), last);
  Val rstd = h.binary("divide", h.splat(1.0, x.shape, "f32"),
                      h.unary("sqrt", h.binary("add", var, h.splat(p.eps(), x.shape, "f32"))));
  Val y = h.binary("multiply", dx, rstd);
  size_t k = 1;
  if (p.has_weight()) y = h.binary("multiply", y, h.broadcast_to(to_f32(h, in[k], dt[k]), x.shape)), ++k;
  if (p.has_bias()) y = h.binary("add", y, h.broadcast_to(to_f32(h, in[k], dt[k]), x.shape));
  r = convert_dtype(h, y, DType::f32, o.dtype);
  return true;
}

bool lower_rms_norm(Hlo& h, const RmsNorm& p, const std::vector<Val>& in,
                    const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || in[0].shape.empty()) return false;
  Val x = to_f32(h, in[0], dt[0]);
  const int64_t last = int64_t(x.shape.size()) - 1;
  Val ms = row_mean(h, h.binary("multiply", x, x), last);
  Val rr = h.binary("divide", h.splat(1.0, x.shape, "f32"),
                    h.unary("sqrt", h.binary("add", ms, h.splat(p.eps(), x.shape, "f32"))));
  Val y = h.binary("multiply", x, rr);
  const DType wt = p.has_weight() ? dt[1] : DType::f32;
  if (p.style() == RmsNormStyle::diffusers && p.has_weight() &&
      (wt == DType::bf16 || wt == DType::f16))
    y = round_through(h, y, wt);
  if (p.style() == RmsNormStyle::llama) y = round_through(h, y, dt[0]);
  if (p.has_weight()) y = h.binary("multiply", y, h.broadcast_to(to_f32(h, in[1], wt), x.shape));
  r = convert_dtype(h, y, DType::f32, o.dtype);
  return true;
}

bool lower_group_norm(Hlo& h, const GroupNorm& p, const std::vector<Val>& in,
                      const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || in[0].shape.size() < 2) return false;
  Val x = to_f32(h, in[0], dt[0]);
  const int64_t n = x.shape[0], c = x.shape[1], g = p.groups();
  const int64_t rest = shape_numel(x.shape) / std::max<int64_t>(n * c, 1);
  Val xg = h.reshape(x, {n, g, (c / g) * rest});
  Val mu = row_mean(h, xg, 2);
  Val dx = h.binary("subtract", xg, mu);
  Val var = row_mean(h, h.binary("multiply", dx, dx), 2);
  Val rstd = h.binary("divide", h.splat(1.0, xg.shape, "f32"),
                      h.unary("sqrt", h.binary("add", var, h.splat(p.eps(), xg.shape, "f32"))));
  Val y = h.reshape(h.binary("multiply", dx, rstd), x.shape);
  size_t k = 1;
  auto per_channel = [&](const Val& w, DType wd) {
    return h.broadcast_in_dim(to_f32(h, w, wd), x.shape, {1});
  };
  if (p.has_weight()) y = h.binary("multiply", y, per_channel(in[k], dt[k])), ++k;
  if (p.has_bias()) y = h.binary("add", y, per_channel(in[k], dt[k]));
  r = convert_dtype(h, y, DType::f32, o.dtype);
  return true;
}

// cos/sin tables (S, D) or (B|1, S, D) broadcast onto x's shape (sequence at dim sd).
Val rope_table(Hlo& h, const Val& t, DType td, const Shape& xs, int64_t sd) {
  Val f = to_f32(h, t, td);
  const int64_t last = int64_t(xs.size()) - 1;
  if (f.shape.size() == 3 && f.shape[0] == 1) f = h.reshape(f, {f.shape[1], f.shape[2]});
  if (f.shape.size() == 2) return h.broadcast_in_dim(f, xs, {sd, last});
  return h.broadcast_in_dim(f, xs, {0, sd, last});
}

bool lower_rope(Hlo& h, const ApplyRope& p, const std::vector<Val>& in,
                const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype)) return false;
  const Shape& xs = in[0].shape;
  const size_t nd = xs.size();
  const int64_t D = xs.back(), half = D / 2;
  Val x = to_f32(h, in[0], dt[0]);
  Val c = rope_table(h, in[1], dt[1], xs, p.sequence_dim());
  Val s = rope_table(h, in[2], dt[2], xs, p.sequence_dim());
  // rotated: (-x[2j+1], x[2j]) interleaved, or (-x[D/2:], x[:D/2]) for split halves.
  Val rot;
  std::vector<int64_t> z(nd, 0);
  if (p.layout() == RopeLayout::interleaved) {
    Shape pairs(xs.begin(), xs.end() - 1);
    pairs.push_back(half);
    pairs.push_back(2);
    Val xp = h.reshape(x, pairs);
    std::vector<int64_t> st(nd + 1, 0), lim(pairs.begin(), pairs.end());
    lim.back() = 1;
    Val even = h.slice(xp, st, lim);
    st.back() = 1;
    lim.back() = 2;
    Val odd = h.slice(xp, st, lim);
    rot = h.reshape(h.concat({h.unary("negate", odd), even}, int64_t(nd)), xs);
  } else {
    std::vector<int64_t> lim(xs.begin(), xs.end()), st(nd, 0);
    lim.back() = half;
    Val first = h.slice(x, st, lim);
    st.back() = half;
    lim.back() = D;
    Val second = h.slice(x, st, lim);
    rot = h.concat({h.unary("negate", second), first}, int64_t(nd - 1));
  }
  Val y;
  if (p.math() == RopeMath::input_dtype && dt[0] != DType::f32) {
    const DType t = dt[0];
    Val a = round_through(h, h.binary("multiply", x, round_through(h, c, t)), t);
    Val b = round_through(h, h.binary("multiply", rot, round_through(h, s, t)), t);
    y = h.binary("add", a, b);
  } else {
    y = h.binary("add", h.binary("multiply", x, c), h.binary("multiply", rot, s));
  }
  r = convert_dtype(h, y, DType::f32, o.dtype);
  return true;
}

// softmax(q k^T * scale + mask) v over (B, H, L, D), in f32; k/v heads repeat for grouped
// queries. Plain HLO: XLA fuses it (a cuDNN custom call on CUDA plugins is a later step).
bool lower_sdpa(Hlo& h, const ScaledDotProductAttention& p, const std::vector<Val>& in,
                const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || in[0].shape.size() != 4) return false;
  Val q = to_f32(h, in[0], dt[0]), k = to_f32(h, in[1], dt[1]), v = to_f32(h, in[2], dt[2]);
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2];
  const int64_t Hkv = k.shape[1], Lk = k.shape[2], D = k.shape[3], Dv = v.shape[3];
  if (Hkv != H) {
    const int64_t g = H / Hkv;
    k = h.reshape(h.broadcast_in_dim(k, {B, Hkv, g, Lk, D}, {0, 1, 3, 4}), {B, H, Lk, D});
    v = h.reshape(h.broadcast_in_dim(v, {B, Hkv, g, Lk, Dv}, {0, 1, 3, 4}), {B, H, Lk, Dv});
  }
  const Shape ss = {B, H, Lq, Lk};
  Val sc = h.dot_general(q, k, {0, 1}, {0, 1}, {3}, {3}, ss);
  sc = h.binary("multiply", sc, h.splat(p.scale(), ss, "f32"));
  Val ninf = h.splat(-INFINITY, ss, "f32");
  if (p.has_mask()) {
    const Val& m = in[3];
    if (dt[3] == DType::boolean) sc = h.select(h.broadcast_to(m, ss), sc, ninf);
    else sc = h.binary("add", sc, h.broadcast_to(to_f32(h, m, dt[3]), ss));
  }
  if (p.causal()) {
    Val i = h.iota(ss, 2, "i64"), j = h.iota(ss, 3, "i64");
    sc = h.select(h.compare("LE", j, i), sc, ninf);
  }
  Val mx = h.broadcast_in_dim(h.reduce(sc, {3}, "maximum", -INFINITY), ss, {0, 1, 2});
  // A row with every key masked has max -inf: its weights are 0 (the CPU kernel's output).
  Val dead = h.compare("EQ", mx, ninf);
  mx = h.select(dead, h.splat(0.0, ss, "f32"), mx);
  Val e = h.select(dead, h.splat(0.0, ss, "f32"),
                   h.unary("exponential", h.binary("subtract", sc, mx)));
  // torch's CPU flash kernel (and the CPU backend): the unnormalised probabilities are rounded
  // to the input dtype before P V; the f32 sum divides the accumulator once at the end.
  Val sum = h.reduce(e, {3}, "add", 0.0);
  Val pv = h.dot_general(round_through(h, e, dt[0]), v, {0, 1}, {0, 1}, {3}, {2}, {B, H, Lq, Dv});
  const Shape os = {B, H, Lq, Dv};
  Val inv = h.binary("divide", h.splat(1.0, {B, H, Lq}, "f32"), sum);
  inv = h.select(h.compare("EQ", sum, h.splat(0.0, {B, H, Lq}, "f32")),
                 h.splat(0.0, {B, H, Lq}, "f32"), inv);
  Val out = h.binary("multiply", pv, h.broadcast_in_dim(inv, os, {0, 1, 2}));
  r = convert_dtype(h, out, DType::f32, o.dtype);
  return true;
}

bool lower_embedding(Hlo& h, const std::vector<Val>& in, const std::vector<DType>& dt,
                     const TensorSpec& o, Val& r) {
  const Val& w = in[0];
  if (w.shape.size() != 2 || !is_intlike(dt[1]) || o.dtype != dt[0]) return false;
  const int64_t n = shape_numel(in[1].shape), d = w.shape[1];
  Val ids = h.reshape(convert_dtype(h, in[1], dt[1], DType::i64), {n, 1});
  r = h.op("gather", {w, ids},
           "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], "
           "start_index_map = [0], index_vector_dim = 1>, slice_sizes = " +
               i64_array({1, d}) + ", indices_are_sorted = false",
           {n, d}, w.et);
  return true;
}

bool lower_concat(Hlo& h, const Concat& p, const std::vector<Val>& in,
                  const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  std::vector<Val> xs;
  for (size_t i = 0; i < in.size(); ++i) xs.push_back(convert_dtype(h, in[i], dt[i], o.dtype));
  r = h.concat(xs, p.dim());
  return true;
}

bool lower_pad(Hlo& h, const Pad& p, const Val& x, DType xd, const TensorSpec& o, Val& r) {
  const size_t nd = x.shape.size();
  std::vector<int64_t> lo(nd, 0), hi(nd, 0);
  for (size_t i = 0; i < p.pads().size() / 2; ++i) {
    lo[nd - 1 - i] = p.pads()[2 * i];
    hi[nd - 1 - i] = p.pads()[2 * i + 1];
  }
  // The fill value as the CPU stores it: float(value) converted to the dtype.
  Val v = convert_dtype(h, h.constant(p.value(), "f32"), DType::f32, xd);
  r = h.pad(x, v, lo, hi);
  return true;
}

bool lower_upsample(Hlo& h, const UpsampleNearest& p, const Val& x, const TensorSpec& o,
                    Val& r) {
  if (x.shape.size() != 4) return false;
  const int64_t f = p.factor(), N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  r = h.reshape(h.broadcast_in_dim(x, {N, C, H, f, W, f}, {0, 1, 2, 4}), o.shape);
  return true;
}

// NCHW x OIHW convolution in f32 (fp32 accumulation, rounded once), zero padding.
bool lower_conv2d(Hlo& h, const Conv2d& p, const std::vector<Val>& in,
                  const std::vector<DType>& dt, const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || in[0].shape.size() != 4 || in[1].shape.size() != 4) return false;
  const Conv2dParams& c = p.params();
  Val x = to_f32(h, in[0], dt[0]), w = to_f32(h, in[1], dt[1]);
  const std::string attrs =
      "window_strides = " + i64_array({c.stride[0], c.stride[1]}) +
      ", padding = dense<[[" + std::to_string(c.padding[0]) + ", " +
      std::to_string(c.padding[1]) + "], [" + std::to_string(c.padding[2]) + ", " +
      std::to_string(c.padding[3]) + "]]> : tensor<2x2xi64>, lhs_dilation = " +
      i64_array({1, 1}) + ", rhs_dilation = " + i64_array({c.dilation[0], c.dilation[1]}) +
      ", dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>" +
      ", feature_group_count = " + std::to_string(c.groups) +
      " : i64, batch_group_count = 1 : i64";
  Val y = h.op("convolution", {x, w}, attrs, o.shape, "f32");
  if (p.has_bias()) y = h.binary("add", y, h.broadcast_in_dim(to_f32(h, in[2], dt[2]), o.shape, {1}));
  r = convert_dtype(h, y, DType::f32, o.dtype);
  return true;
}

// diffusers' RoPE tables: float64 frequencies and angles, cos/sin rounded to f32 and repeated
// for each pair; the frequencies are computed here exactly as the CPU computes them.
bool lower_rope_frequencies(Hlo& h, const RopeFrequencies& p, const Val& ids, DType idt,
                            const std::vector<TensorSpec>& outs, std::vector<Val>& res) {
  if (ids.shape.empty()) return false;
  const int64_t n_ids = ids.shape.back(), rows = shape_numel(ids.shape) / std::max<int64_t>(n_ids, 1);
  if (int64_t(p.axes_dim().size()) > n_ids) return false;
  Val id = h.convert(h.reshape(to_f32(h, ids, idt), {rows, n_ids}), "f64");
  std::vector<double> freqs;
  std::vector<Val> pos;
  for (size_t a = 0; a < p.axes_dim().size(); ++a) {
    const int64_t d = p.axes_dim()[a];
    for (int64_t i = 0; i < d; i += 2) freqs.push_back(1.0 / std::pow(p.theta(), double(i) / double(d)));
    Val col = h.reshape(h.slice(id, {0, int64_t(a)}, {rows, int64_t(a) + 1}), {rows});
    pos.push_back(h.broadcast_in_dim(col, {rows, d / 2}, {0}));
  }
  const int64_t F = int64_t(freqs.size());
  Val angle = h.binary("multiply", h.concat(pos, 1),
                       h.broadcast_in_dim(h.constant_vector(freqs, "f64"), {rows, F}, {1}));
  for (const char* fn : {"cosine", "sine"}) {
    Val v = h.convert(h.unary(fn, angle), "f32");
    v = h.reshape(h.broadcast_in_dim(v, {rows, F, 2}, {0, 1}), {rows, 2 * F});
    res.push_back(h.reshape(convert_dtype(h, v, DType::f32, outs[res.size()].dtype),
                            outs[res.size()].shape));
  }
  return true;
}

bool lower_timestep_embedding(Hlo& h, const TimestepEmbedding& p, const Val& t, DType td,
                              const TensorSpec& o, Val& r) {
  const int64_t half = p.dim() / 2, n = shape_numel(t.shape);
  // freq[i] = exp((i * -log(max_period)) / (half - shift)), each step one f32 op (as the CPU).
  const float neg_log = float(-std::log(p.max_period()));
  const float denom = float(double(half) - p.downscale_freq_shift());
  std::vector<double> freq;
  for (int64_t i = 0; i < half; ++i) freq.push_back(std::exp((float(i) * neg_log) / denom));
  Val tf = h.broadcast_in_dim(h.reshape(to_f32(h, t, td), {n}), {n, half}, {0});
  Val arg = h.binary("multiply", tf, h.broadcast_in_dim(h.constant_vector(freq, "f32"), {n, half}, {1}));
  arg = h.binary("multiply", h.splat(p.scale(), {n, half}, "f32"), arg);
  Val sn = h.unary("sine", arg), cs = h.unary("cosine", arg);
  std::vector<Val> parts = p.flip_sin_to_cos() ? std::vector<Val>{cs, sn} : std::vector<Val>{sn, cs};
  if (p.dim() % 2) parts.push_back(h.splat(0.0, {n, 1}, "f32"));
  r = convert_dtype(h, h.concat(parts, 1), DType::f32, o.dtype);
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

bool lower(Hlo& h, const Primitive& p, const std::vector<Val>& in,
           const std::vector<DType>& dt, const std::vector<TensorSpec>& outs,
           std::vector<Val>& results) {
  if (auto* rf = dynamic_cast<const RopeFrequencies*>(&p))
    return outs.size() == 2 && lower_rope_frequencies(h, *rf, in[0], dt[0], outs, results);
  if (outs.size() != 1) return false;
  const TensorSpec& o = outs[0];
  Val r;
  bool ok = false;
  if (auto* b = dynamic_cast<const Binary*>(&p)) ok = lower_binary(h, *b, in, dt, o, r);
  else if (auto* s = dynamic_cast<const BinaryScalar*>(&p))
    ok = lower_binary_scalar(h, *s, in[0], dt[0], o, r);
  else if (auto* u = dynamic_cast<const Unary*>(&p)) ok = lower_unary(h, *u, in[0], dt[0], o, r);
  else if (auto* g = dynamic_cast<const Glu*>(&p)) ok = lower_glu(h, *g, in[0], dt[0], o, r);
  else if (dynamic_cast<const Where*>(&p)) ok = lower_where(h, in, dt, o, r);
  else if (dynamic_cast<const Copy*>(&p)) {
    r = convert_dtype(h, in[0], dt[0], o.dtype);
    ok = true;
  } else if (dynamic_cast<const Matmul*>(&p)) ok = lower_matmul(h, in, dt, o, r);
  else if (auto* l = dynamic_cast<const Linear*>(&p)) ok = lower_linear(h, *l, in, dt, o, r);
  else if (auto* sm = dynamic_cast<const Softmax*>(&p))
    ok = lower_softmax(h, *sm, in[0], dt[0], o, r);
  else if (auto* rd = dynamic_cast<const Reduce*>(&p))
    ok = lower_reduce(h, *rd, in[0], dt[0], o, r);
  else if (auto* ln = dynamic_cast<const LayerNorm*>(&p)) ok = lower_layer_norm(h, *ln, in, dt, o, r);
  else if (auto* rn = dynamic_cast<const RmsNorm*>(&p)) ok = lower_rms_norm(h, *rn, in, dt, o, r);
  else if (auto* gn = dynamic_cast<const GroupNorm*>(&p)) ok = lower_group_norm(h, *gn, in, dt, o, r);
  else if (auto* ro = dynamic_cast<const ApplyRope*>(&p)) ok = lower_rope(h, *ro, in, dt, o, r);
  else if (auto* at = dynamic_cast<const ScaledDotProductAttention*>(&p))
    ok = lower_sdpa(h, *at, in, dt, o, r);
  else if (dynamic_cast<const Embedding*>(&p)) ok = lower_embedding(h, in, dt, o, r);
  else if (auto* cc = dynamic_cast<const Concat*>(&p)) ok = lower_concat(h, *cc, in, dt, o, r);
  else if (auto* pd = dynamic_cast<const Pad*>(&p)) ok = lower_pad(h, *pd, in[0], dt[0], o, r);
  else if (auto* up = dynamic_cast<const UpsampleNearest*>(&p))
    ok = lower_upsample(h, *up, in[0], o, r);
  else if (auto* te = dynamic_cast<const TimestepEmbedding*>(&p))
    ok = lower_timestep_embedding(h, *te, in[0], dt[0], o, r);
  else if (auto* cv = dynamic_cast<const Conv2d*>(&p)) ok = lower_conv2d(h, *cv, in, dt, o, r);
  if (!ok) return false;
  results.push_back(h.reshape(r, o.shape));
  return true;
}

}  // namespace tessera::xla
