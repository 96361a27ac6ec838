// StableHLO lowerings of the network blocks' primitives: norms, RoPE and its tables, attention
// (plain HLO), embeddings, concat/pad, upsampling and convolution (xla_lowering.h).
#include <cmath>

#include "backends/xla/lowering_util.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/resample.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"

namespace tessera::xla {
namespace {
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
  if (p.has_weight())
    y = h.binary("multiply", y, h.broadcast_to(to_f32(h, in[k], dt[k]), x.shape)), ++k;
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
    if (dt[3] == DType::boolean)
      sc = h.select(h.broadcast_to(m, ss), sc, ninf);
    else
      sc = h.binary("add", sc, h.broadcast_to(to_f32(h, m, dt[3]), ss));
  }
  if (p.causal()) {
    Val i = h.iota(ss, 2, "i64"), j = h.iota(ss, 3, "i64");
    sc = h.select(h.compare("LE", j, i), sc, ninf);
  }
  Val mx = h.broadcast_in_dim(h.reduce(sc, {3}, "maximum", -INFINITY), ss, {0, 1, 2});
  // A row with every key masked has max -inf: its weights are 0 (the CPU kernel's output).
  Val dead = h.compare("EQ", mx, ninf);
  mx = h.select(dead, h.splat(0.0, ss, "f32"), mx);
  Val e =
      h.select(dead, h.splat(0.0, ss, "f32"), h.unary("exponential", h.binary("subtract", sc, mx)));
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

bool lower_concat(Hlo& h, const Concat& p, const std::vector<Val>& in, const std::vector<DType>& dt,
                  const TensorSpec& o, Val& r) {
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

bool lower_upsample(Hlo& h, const UpsampleNearest& p, const Val& x, const TensorSpec& o, Val& r) {
  if (x.shape.size() != 4) return false;
  const int64_t f = p.factor(), N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  r = h.reshape(h.broadcast_in_dim(x, {N, C, H, f, W, f}, {0, 1, 2, 4}), o.shape);
  return true;
}

// NCHW x OIHW convolution in f32 (fp32 accumulation, rounded once), zero padding.
bool lower_conv2d(Hlo& h, const Conv2d& p, const std::vector<Val>& in, const std::vector<DType>& dt,
                  const TensorSpec& o, Val& r) {
  if (!is_float(o.dtype) || in[0].shape.size() != 4 || in[1].shape.size() != 4) return false;
  const Conv2dParams& c = p.params();
  Val x = to_f32(h, in[0], dt[0]), w = to_f32(h, in[1], dt[1]);
  const std::string attrs =
      "window_strides = " + i64_array({c.stride[0], c.stride[1]}) + ", padding = dense<[[" +
      std::to_string(c.padding[0]) + ", " + std::to_string(c.padding[1]) + "], [" +
      std::to_string(c.padding[2]) + ", " + std::to_string(c.padding[3]) +
      "]]> : tensor<2x2xi64>, lhs_dilation = " + i64_array({1, 1}) +
      ", rhs_dilation = " + i64_array({c.dilation[0], c.dilation[1]}) +
      ", dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>" +
      ", feature_group_count = " + std::to_string(c.groups) + " : i64, batch_group_count = 1 : i64";
  Val y = h.op("convolution", {x, w}, attrs, o.shape, "f32");
  if (p.has_bias())
    y = h.binary("add", y, h.broadcast_in_dim(to_f32(h, in[2], dt[2]), o.shape, {1}));
  r = convert_dtype(h, y, DType::f32, o.dtype);
  return true;
}

// diffusers' RoPE tables: float64 frequencies and angles, cos/sin rounded to f32 and repeated
// for each pair; the frequencies are computed here exactly as the CPU computes them.
bool lower_rope_frequencies(Hlo& h, const RopeFrequencies& p, const Val& ids, DType idt,
                            const std::vector<TensorSpec>& outs, std::vector<Val>& res) {
  if (ids.shape.empty()) return false;
  const int64_t n_ids = ids.shape.back(),
                rows = shape_numel(ids.shape) / std::max<int64_t>(n_ids, 1);
  if (int64_t(p.axes_dim().size()) > n_ids) return false;
  Val id = h.convert(h.reshape(to_f32(h, ids, idt), {rows, n_ids}), "f64");
  std::vector<double> freqs;
  std::vector<Val> pos;
  for (size_t a = 0; a < p.axes_dim().size(); ++a) {
    const int64_t d = p.axes_dim()[a];
    for (int64_t i = 0; i < d; i += 2)
      freqs.push_back(1.0 / std::pow(p.theta(), double(i) / double(d)));
    Val col = h.reshape(h.slice(id, {0, int64_t(a)}, {rows, int64_t(a) + 1}), {rows});
    pos.push_back(h.broadcast_in_dim(col, {rows, d / 2}, {0}));
  }
  const int64_t F = int64_t(freqs.size());
  Val angle = h.binary("multiply", h.concat(pos, 1),
                       h.broadcast_in_dim(h.constant_vector(freqs, "f64"), {rows, F}, {1}));
  for (const char* fn : {"cosine", "sine"}) {
    Val v = h.convert(h.unary(fn, angle), "f32");
    v = h.reshape(h.broadcast_in_dim(v, {rows, F, 2}, {0, 1}), {rows, 2 * F});
    res.push_back(
        h.reshape(convert_dtype(h, v, DType::f32, outs[res.size()].dtype), outs[res.size()].shape));
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
  Val arg =
      h.binary("multiply", tf, h.broadcast_in_dim(h.constant_vector(freq, "f32"), {n, half}, {1}));
  arg = h.binary("multiply", h.splat(p.scale(), {n, half}, "f32"), arg);
  Val sn = h.unary("sine", arg), cs = h.unary("cosine", arg);
  std::vector<Val> parts =
      p.flip_sin_to_cos() ? std::vector<Val>{cs, sn} : std::vector<Val>{sn, cs};
  if (p.dim() % 2) parts.push_back(h.splat(0.0, {n, 1}, "f32"));
  r = convert_dtype(h, h.concat(parts, 1), DType::f32, o.dtype);
  return true;
}

}  // namespace

bool lower_nn(Hlo& h, const Primitive& p, const std::vector<Val>& in, const std::vector<DType>& dt,
              const std::vector<TensorSpec>& outs, std::vector<Val>& results, bool& matched) {
  matched = true;
  if (auto* rf = dynamic_cast<const RopeFrequencies*>(&p))
    return outs.size() == 2 && lower_rope_frequencies(h, *rf, in[0], dt[0], outs, results);
  if (outs.size() != 1) {
    matched = false;
    return false;
  }
  const TensorSpec& o = outs[0];
  Val r;
  bool ok = false;
  if (auto* ln = dynamic_cast<const LayerNorm*>(&p))
    ok = lower_layer_norm(h, *ln, in, dt, o, r);
  else if (auto* rn = dynamic_cast<const RmsNorm*>(&p))
    ok = lower_rms_norm(h, *rn, in, dt, o, r);
  else if (auto* gn = dynamic_cast<const GroupNorm*>(&p))
    ok = lower_group_norm(h, *gn, in, dt, o, r);
  else if (auto* ro = dynamic_cast<const ApplyRope*>(&p))
    ok = lower_rope(h, *ro, in, dt, o, r);
  else if (auto* at = dynamic_cast<const ScaledDotProductAttention*>(&p))
    ok = lower_sdpa(h, *at, in, dt, o, r);
  else if (dynamic_cast<const Embedding*>(&p))
    ok = lower_embedding(h, in, dt, o, r);
  else if (auto* cc = dynamic_cast<const Concat*>(&p))
    ok = lower_concat(h, *cc, in, dt, o, r);
  else if (auto* pd = dynamic_cast<const Pad*>(&p))
    ok = lower_pad(h, *pd, in[0], dt[0], o, r);
  else if (auto* up = dynamic_cast<const UpsampleNearest*>(&p))
    ok = lower_upsample(h, *up, in[0], o, r);
  else if (auto* te = dynamic_cast<const TimestepEmbedding*>(&p))
    ok = lower_timestep_embedding(h, *te, in[0], dt[0], o, r);
  else if (auto* cv = dynamic_cast<const Conv2d*>(&p))
    ok = lower_conv2d(h, *cv, in, dt, o, r);
  else
    matched = false;
  if (!ok) return false;
  results.push_back(h.reshape(r, o.shape));
  return true;
}

}  // namespace tessera::xla
