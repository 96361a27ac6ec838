// CPU concat and constant pad: contiguous runs copied with dtype conversion.
#include "ops/shape_ops.h"

#include <cstring>

#include "ops/copy.h"
#include "runtime/parallel.h"

namespace tessera {

void Concat::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor& o = out[0];
  const Shape& s = o.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim_; ++i) outer *= s[i];
  for (int64_t i = dim_ + 1; i < o.ndim(); ++i) inner *= s[i];
  const int64_t out_row = s[dim_] * inner;
  const size_t os = dtype_size(o.dtype());
  char* dst = static_cast<char*>(o.raw_data());
  int64_t start = 0;
  for (const Tensor& t0 : in) {
    const Tensor t = contiguous(t0);
    const int64_t run = t.shape()[dim_] * inner;
    const size_t ts = dtype_size(t.dtype());
    const char* src = static_cast<const char*>(t.raw_data());
    parallel_for(
        outer, std::max<int64_t>(1, 65536 / std::max<int64_t>(run, 1)), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r)
            convert_elements(src + r * run * int64_t(ts), t.dtype(),
                             dst + (r * out_row + start) * int64_t(os), o.dtype(), size_t(run));
        });
    start += run;
  }
}

void Pad::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  const int64_t nd = x.ndim();
  const size_t es = dtype_size(o.dtype());
  // Fill with the value in the output dtype, then copy the kept region.
  char fill[8] = {};
  const float v = float(value_);
  convert_elements(&v, DType::f32, fill, o.dtype(), 1);
  char* dst = static_cast<char*>(o.raw_data());
  const int64_t total = o.numel();
  parallel_for(total, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(dst + i * int64_t(es), fill, es);
  });
  if (nd == 0 || total == 0) return;
  // Per dim: first source index kept, first destination index, and count kept.
  std::vector<int64_t> src0(nd, 0), dst0(nd, 0), cnt(nd);
  for (int64_t d = 0; d < nd; ++d) cnt[d] = x.shape()[d];
  for (size_t i = 0; i < pads_.size() / 2; ++i) {
    const int64_t d = nd - 1 - int64_t(i), lo = pads_[2 * i], hi = pads_[2 * i + 1];
    src0[d] = lo < 0 ? -lo : 0;
    dst0[d] = lo > 0 ? lo : 0;
    cnt[d] = x.shape()[d] - src0[d] - (hi < 0 ? -hi : 0);
    if (cnt[d] <= 0) return;
  }
  const Strides xs = x.strides(), ost = o.strides();
  const Shape outer(cnt.begin(), cnt.end() - 1);
  const int64_t rows = shape_numel(outer), run = cnt[nd - 1];
  const char* src = static_cast<const char*>(x.raw_data());
  parallel_for(rows, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t so = src0[nd - 1], doff = dst0[nd - 1], rem = r;
      for (int64_t d = nd - 2; d >= 0; --d) {
        const int64_t idx = rem % cnt[d];
        rem /= cnt[d];
        so += (idx + src0[d]) * xs[d];
        doff += (idx + dst0[d]) * ost[d];
      }
      std::memcpy(dst + doff * int64_t(es), src + so * int64_t(es), size_t(run) * es);
    }
  });
}

}  // namespace tessera
