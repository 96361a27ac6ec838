// RoPE on CPU. The tables follow diffusers' float64 arithmetic; the rotation keeps torch's
// evaluation order (two products, then the sum) so results match bit for bit where possible.
#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "ops/copy.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

Tensor contiguous_as(const Tensor& t, DType dt) {
  if (t.is_contiguous() && t.dtype() == dt) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  std::vector<Tensor> outs = {c};
  Copy().eval_cpu({t}, outs);
  return c;
}

}  // namespace

void RopeFrequencies::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  // ids.float() first, as diffusers does; then float64 for the frequencies and angles.
  const Tensor ids = contiguous_as(in[0], DType::f32);
  const int64_t n_ids = ids.dim(-1), rows = ids.numel() / n_ids;
  const int64_t total = out[0].dim(-1);
  std::vector<double> freqs;
  for (int64_t d : axes_dim_)
    for (int64_t i = 0; i < d; i += 2)
      freqs.push_back(1.0 / std::pow(theta_, double(i) / double(d)));
  const float* id = ids.data<float>();
  float* c = out[0].data<float>();
  float* s = out[1].data<float>();
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t col = 0, f = 0;
      for (size_t a = 0; a < axes_dim_.size(); ++a) {
        const double pos = double(id[r * n_ids + int64_t(a)]);
        for (int64_t i = 0; i < axes_dim_[a] / 2; ++i, ++f) {
          const double angle = pos * freqs[size_t(f)];
          const float cv = float(std::cos(angle)), sv = float(std::sin(angle));
          c[r * total + col] = c[r * total + col + 1] = cv;
          s[r * total + col] = s[r * total + col + 1] = sv;
          col += 2;
        }
      }
    }
  });
}

void ApplyRope::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous_as(in[0], in[0].dtype());
  const Tensor cos = contiguous_as(in[1], DType::f32), sin = contiguous_as(in[2], DType::f32);
  const DType dt = x.dtype();
  const bool round_each = math_ == RopeMath::input_dtype && dt != DType::f32;
  auto rnd = [&](float v) {
    if (!round_each) return v;
    float r;
    convert_elements(&v, DType::f32, &r, dt, 1);  // round to dt ...
    float back;
    convert_elements(&r, dt, &back, DType::f32, 1);  // ... and read it back
    return back;
  };
  const int64_t D = x.dim(-1), half = D / 2, S = x.dim(sequence_dim_);
  const int64_t rows = x.numel() / D;
  int64_t per_s = 1;  // rows between consecutive sequence positions
  for (int64_t d = sequence_dim_ + 1; d < x.ndim() - 1; ++d) per_s *= x.dim(d);
  const bool batched = cos.ndim() == 3 && cos.dim(0) > 1;
  const int64_t rows_per_batch = rows / x.dim(0);
  const size_t es = dtype_size(dt);
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out[0].raw_data());
  // ~8K elements per task, so the short head rows of small models do not fork threads.
  const int64_t grain = std::max<int64_t>(256, 8192 / std::max<int64_t>(D, 1));
  const float* cos_base = cos.data<float>();  // once, not per row (data() checks and syncs)
  const float* sin_base = sin.data<float>();
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    const size_t nd = static_cast<size_t>(D);
    std::vector<float> xr(nd), o(nd), cr(nd), sr(nd);
    for (int64_t r = b; r < e; ++r) {
      const int64_t s_idx = (r / per_s) % S;
      const int64_t table_row = (batched ? (r / rows_per_batch) * S : 0) + s_idx;
      const float* cp = cos_base + table_row * D;
      const float* sp = sin_base + table_row * D;
      convert_elements(src + r * D * int64_t(es), dt, xr.data(), DType::f32, size_t(D));
      if (!round_each) {
        // torch's order: x * cos and rotated * sin rounded separately, then summed
        // (a + (-b) == a - b exactly). No FMA in the baseline build, so nothing is contracted.
        const float* x = xr.data();
        float* y = o.data();
        if (layout_ == RopeLayout::interleaved) {
          for (int64_t j = 0; j < D; j += 2) {
            y[j] = x[j] * cp[j] - x[j + 1] * sp[j];
            y[j + 1] = x[j + 1] * cp[j + 1] + x[j] * sp[j + 1];
          }
        } else {
          for (int64_t j = 0; j < half; ++j) y[j] = x[j] * cp[j] - x[j + half] * sp[j];
          for (int64_t j = half; j < D; ++j) y[j] = x[j] * cp[j] + x[j - half] * sp[j];
        }
      } else {
        for (int64_t j = 0; j < D; ++j) {
          cr[j] = rnd(cp[j]);
          sr[j] = rnd(sp[j]);
        }
        for (int64_t j = 0; j < D; ++j) {
          float rot;
          if (layout_ == RopeLayout::interleaved)
            rot = (j & 1) ? xr[j - 1] : -xr[j + 1];
          else
            rot = j < half ? -xr[j + half] : xr[j - half];
          o[j] = rnd(rnd(xr[j] * cr[j]) + rnd(rot * sr[j]));
        }
      }
      convert_elements(o.data(), DType::f32, dst + r * D * int64_t(es), dt, size_t(D));
    }
  });
}

}  // namespace tessera
