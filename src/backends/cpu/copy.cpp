#include "ops/copy.h"

#include <algorithm>

#include "runtime/parallel.h"

namespace tessera {

void Copy::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& src = in[0];
  Tensor& dst = out[0];
  const int64_t n = src.numel();
  if (src.is_contiguous()) {
    const size_t ss = dtype_size(src.dtype()), ds = dtype_size(dst.dtype());
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(dst.raw_data());
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      convert_elements(s + b * ss, src.dtype(), d + b * ds, dst.dtype(), size_t(e - b));
    });
    return;
  }
  // Strided source: walk rows of the innermost dimension.
  const int64_t inner = src.ndim() ? src.shape().back() : 1;
  const int64_t inner_stride = src.ndim() ? src.strides().back() : 1;
  const int64_t rows = inner ? n / inner : 0;
  Shape outer(src.shape().begin(), src.shape().end() - (src.ndim() ? 1 : 0));
  Strides outer_st(src.strides().begin(), src.strides().end() - (src.ndim() ? 1 : 0));
  // Reused per thread: a fresh vector of a few KB per call went through malloc's slow bins on
  // every strided copy (a deferred FLUX step makes dozens). Bound by reference before the
  // parallel loop, so workers read this thread's vector.
  static thread_local std::vector<int64_t> offsets_buffer;
  std::vector<int64_t>& row_offsets = offsets_buffer;
  row_offsets.clear();
  row_offsets.reserve(size_t(rows));
  for_each_offset(outer, outer_st, src.offset(), [&](int64_t off) { row_offsets.push_back(off); });
  const size_t ss = dtype_size(src.dtype()), ds = dtype_size(dst.dtype());
  const char* base = static_cast<const char*>(src.storage()->data());
  char* d = static_cast<char*>(dst.raw_data());
  // ~16K elements per task: short rows (attention heads) stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1));
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const char* s = base + row_offsets[r] * int64_t(ss);
      char* o = d + r * inner * int64_t(ds);
      if (inner_stride == 1) {
        convert_elements(s, src.dtype(), o, dst.dtype(), size_t(inner));
      } else {
        for (int64_t i = 0; i < inner; ++i)
          convert_elements(s + i * inner_stride * int64_t(ss), src.dtype(), o + i * int64_t(ds),
                           dst.dtype(), 1);
      }
    }
  });
}

}  // namespace tessera
