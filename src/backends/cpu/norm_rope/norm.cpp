// CPU layer/RMS/group norm: per-row (per-group) fp32 statistics over kEwChunk chunks with a
// double running total, then one fused scale/shift/affine pass per chunk.
#include "ops/norm.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/elementwise/elementwise_kernels.h"
#include "ops/copy.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

// Per-chunk addresses without raw_data()'s checks and sync (a cost per row at small widths): each
// eval calls ready() on its tensors first.
void ready(const Tensor& x, const Tensor& o) {
  x.raw_data();
  o.raw_data();
}
const char* at(const Tensor& t, int64_t elem) {
  return static_cast<const char*>(t.impl()->storage->data()) +
         (t.offset() + elem) * int64_t(dtype_size(t.dtype()));
}
char* at_mut(const Tensor& t, int64_t elem) {
  return static_cast<char*>(t.impl()->storage->data()) +
         (t.offset() + elem) * int64_t(dtype_size(t.dtype()));
}

std::vector<float> param_f32(const Tensor& p) {
  if (!p.defined()) return {};
  return contiguous(p).to_floats();
}

// Mean and biased variance of n contiguous elements of x starting at `start` (two passes).
void moments(const Tensor& x, int64_t start, int64_t n, float* mean, float* var) {
  const EwKernels& k = ew_kernels();
  float buf[kEwChunk];
  double s = 0;
  for (int64_t c = 0; c < n; c += kEwChunk) {
    const int64_t m = std::min(kEwChunk, n - c);
    s += k.sum(ew_load(at(x, start + c), x.dtype(), m, buf), m);
  }
  const float mu = float(s / double(n));
  double q = 0;
  for (int64_t c = 0; c < n; c += kEwChunk) {
    const int64_t m = std::min(kEwChunk, n - c);
    q += k.sum_sq_dev(ew_load(at(x, start + c), x.dtype(), m, buf), mu, m);
  }
  *mean = mu;
  *var = float(q / double(n));
}

// f32 in and out: rows are read and written in place by the several-rows kernels.
bool f32_in_out(const Tensor& x, const Tensor& o) {
  return x.dtype() == DType::f32 && o.dtype() == DType::f32;
}

int64_t row_grain(int64_t d) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1));
}

// Rows r0..r1 of d <= kEwChunk elements: each row loaded as floats, normalised by
// `row(in, out)` (a row-kernel call) straight into an f32 output, else into bo and stored.
template <typename RowFn>
void short_rows(const Tensor& x, const Tensor& o, int64_t d, int64_t r0, int64_t r1, float* buf,
                float* bo, RowFn&& row) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* f = ew_load(at(x, r * d), x.dtype(), d, buf);
    float* fo = o.dtype() == DType::f32 ? reinterpret_cast<float*>(at_mut(o, r * d)) : bo;
    row(f, fo);
    if (fo == bo) ew_store(bo, at_mut(o, r * d), o.dtype(), d);
  }
}

}  // namespace

void LayerNorm::f32_rows(const float* x, int64_t rows, int64_t d, const float* w, const float* b,
                         float* o) const {
  const EwKernels& k = ew_kernels();
  k.layer_norm_rows(x, rows, d, float(eps_), o);
  if (w || b)
    for (int64_t r = 0; r < rows; ++r) {
      if (w) k.binary(BinaryOp::mul, o + r * d, 1, w, 1, o + r * d, d);
      if (b) k.binary(BinaryOp::add, o + r * d, 1, b, 1, o + r * d, d);
    }
}

void RmsNorm::f32_rows(const float* x, int64_t rows, int64_t d, const float* w, float* o) const {
  ew_kernels().rms_norm_rows(x, rows, d, float(eps_), w, o);
}

void LayerNorm::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  ready(x, o);
  const std::vector<float> w = param_f32(has_weight_ ? in[1] : Tensor());
  const std::vector<float> b = param_f32(has_bias_ ? in[has_weight_ ? 2 : 1] : Tensor());
  const int64_t d = x.shape().back();
  const int64_t rows = d ? x.numel() / d : 0;
  const EwKernels& k = ew_kernels();
  const float eps = float(eps_);
  parallel_for(rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    float buf[kEwChunk], bo[kEwChunk];
    if (d <= kEwChunk) {  // one chunk per row: one row-kernel call (same bits as below)
      if (f32_in_out(x, o)) {  // all rows in one call (several at once where the ISA can)
        this->f32_rows(reinterpret_cast<const float*>(at(x, r0 * d)), r1 - r0, d,
                       w.empty() ? nullptr : w.data(), b.empty() ? nullptr : b.data(),
                       reinterpret_cast<float*>(at_mut(o, r0 * d)));
        return;
      }
      short_rows(x, o, d, r0, r1, buf, bo, [&](const float* f, float* fo) {
        k.layer_norm_row(f, d, eps, fo);
        if (!w.empty()) k.binary(BinaryOp::mul, fo, 1, w.data(), 1, fo, d);
        if (!b.empty()) k.binary(BinaryOp::add, fo, 1, b.data(), 1, fo, d);
      });
      return;
    }
    for (int64_t r = r0; r < r1; ++r) {
      float mean, var;
      moments(x, r * d, d, &mean, &var);
      const float rstd = 1.f / std::sqrt(std::max(var, 0.f) + eps);
      for (int64_t c = 0; c < d; c += kEwChunk) {
        const int64_t m = std::min(kEwChunk, d - c);
        const float* f = ew_load(at(x, r * d + c), x.dtype(), m, buf);
        k.scale_shift(f, rstd, -rstd * mean, bo, m);
        if (!w.empty()) k.binary(BinaryOp::mul, bo, 1, w.data() + c, 1, bo, m);
        if (!b.empty()) k.binary(BinaryOp::add, bo, 1, b.data() + c, 1, bo, m);
        ew_store(bo, at_mut(o, r * d + c), o.dtype(), m);
      }
    }
  });
}

void RmsNorm::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  ready(x, o);
  const std::vector<float> w = param_f32(has_weight_ ? in[1] : Tensor());
  const DType wt = has_weight_ ? in[1].dtype() : DType::f32;
  const bool round_to_w =
      style_ == RmsNormStyle::diffusers && has_weight_ && (wt == DType::bf16 || wt == DType::f16);
  const bool round_to_x = style_ == RmsNormStyle::llama;
  const int64_t d = x.shape().back();
  const int64_t rows = d ? x.numel() / d : 0;
  const EwKernels& k = ew_kernels();
  const float eps = float(eps_);
  parallel_for(rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    float buf[kEwChunk], bo[kEwChunk];
    if (d <= kEwChunk && !round_to_w && !round_to_x) {  // the row kernel, as LayerNorm's
      if (f32_in_out(x, o)) {
        this->f32_rows(reinterpret_cast<const float*>(at(x, r0 * d)), r1 - r0, d,
                       w.empty() ? nullptr : w.data(), reinterpret_cast<float*>(at_mut(o, r0 * d)));
        return;
      }
      short_rows(x, o, d, r0, r1, buf, bo, [&](const float* f, float* fo) {
        k.rms_norm_row(f, d, eps, w.empty() ? nullptr : w.data(), fo);
      });
      return;
    }
    for (int64_t r = r0; r < r1; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < d; c += kEwChunk) {
        const int64_t m = std::min(kEwChunk, d - c);
        ss += k.sum_sq(ew_load(at(x, r * d + c), x.dtype(), m, buf), m);
      }
      // torch: mean = sum / n in fp32, then rsqrt(mean + eps) as 1 / sqrt.
      const float var = float(ss) / float(d);
      const float rr = 1.f / std::sqrt(var + eps);
      for (int64_t c = 0; c < d; c += kEwChunk) {
        const int64_t m = std::min(kEwChunk, d - c);
        const float* f = ew_load(at(x, r * d + c), x.dtype(), m, buf);
        k.binary(BinaryOp::mul, f, 1, &rr, 0, bo, m);
        if (round_to_w) ew_round_through(bo, wt, m);
        if (round_to_x) ew_round_through(bo, x.dtype(), m);
        if (!w.empty()) k.binary(BinaryOp::mul, bo, 1, w.data() + c, 1, bo, m);
        ew_store(bo, at_mut(o, r * d + c), o.dtype(), m);
      }
    }
  });
}

void GroupNorm::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  ready(x, o);
  const std::vector<float> w = param_f32(has_weight_ ? in[1] : Tensor());
  const std::vector<float> b = param_f32(has_bias_ ? in[has_weight_ ? 2 : 1] : Tensor());
  const int64_t n = x.shape()[0], ch = x.shape()[1];
  const int64_t hw = n * ch != 0 ? x.numel() / (n * ch) : 0;
  const int64_t cpg = ch / groups_;
  const EwKernels& k = ew_kernels();
  const float eps = float(eps_);
  parallel_for(n * groups_, 1, [&](int64_t g0, int64_t g1) {
    float buf[kEwChunk], bo[kEwChunk];
    for (int64_t ng = g0; ng < g1; ++ng) {
      const int64_t start = ng * cpg * hw;
      float mean, var;
      moments(x, start, cpg * hw, &mean, &var);
      const float rstd = 1.f / std::sqrt(std::max(var, 0.f) + eps);
      for (int64_t ci = 0; ci < cpg; ++ci) {
        const int64_t c = (ng % groups_) * cpg + ci;
        const float scale = rstd * (w.empty() ? 1.f : w[c]);
        const float shift = -scale * mean + (b.empty() ? 0.f : b[c]);
        const int64_t base = start + ci * hw;
        for (int64_t s = 0; s < hw; s += kEwChunk) {
          const int64_t m = std::min(kEwChunk, hw - s);
          k.scale_shift(ew_load(at(x, base + s), x.dtype(), m, buf), scale, shift, bo, m);
          ew_store(bo, at_mut(o, base + s), o.dtype(), m);
        }
      }
    }
  });
}

}  // namespace tessera
