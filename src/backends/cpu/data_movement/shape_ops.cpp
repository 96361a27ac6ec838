// CPU concat and constant pad: contiguous runs copied with dtype conversion.
#include "ops/shape_ops.h"

#include <algorithm>
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

namespace {

// Concatenation of contiguous inputs of the output's dtype, prepared for one set of shapes: each
// outer row of the output is one byte copy per input, as eval_cpu's loop without its per-call
// contiguity and dtype handling.
class PreparedConcat final : public PreparedKernel {
 public:
  PreparedConcat(int64_t outer, std::vector<int64_t> run_bytes)
      : outer_(outer), runs_(std::move(run_bytes)) {
    for (int64_t r : runs_) row_bytes_ += r;
  }
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    char* dst = static_cast<char*>(out[0].raw_data());
    int64_t start = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const char* src = static_cast<const char*>(in[i].raw_data());
      const int64_t run = runs_[i], row = row_bytes_;
      parallel_for(outer_, std::max<int64_t>(1, 262144 / std::max<int64_t>(run, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r)
                       std::memcpy(dst + r * row + start, src + r * run, size_t(run));
                   });
      start += run;
    }
  }

 private:
  int64_t outer_, row_bytes_ = 0;
  std::vector<int64_t> runs_;  // bytes per outer row of each input
};

}  // namespace

std::unique_ptr<PreparedKernel> Concat::prepare_cpu(const std::vector<Tensor>& in,
                                                    const std::vector<Tensor>& out) {
  const Tensor& o = out[0];
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim_; ++i) outer *= o.shape()[i];
  for (int64_t i = dim_ + 1; i < o.ndim(); ++i) inner *= o.shape()[i];
  std::vector<int64_t> runs;
  for (const Tensor& t : in) {
    if (!t.is_contiguous() || t.dtype() != o.dtype()) return nullptr;
    runs.push_back(t.shape()[dim_] * inner * int64_t(dtype_size(t.dtype())));
  }
  return std::make_unique<PreparedConcat>(outer, std::move(runs));
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
