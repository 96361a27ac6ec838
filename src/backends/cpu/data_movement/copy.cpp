#include "ops/copy.h"

#include <algorithm>
#include <cstring>

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

namespace {

// A strided copy without conversion, prepared for one view (compiled programs, replayed
// segments): the row offsets that eval_cpu walks per call are computed once, and each row is a
// plain byte copy. The view's own offset is read per run (a bound input may start elsewhere).
class PreparedStridedCopy final : public PreparedKernel {
 public:
  PreparedStridedCopy(std::vector<int64_t> rows, int64_t row_bytes, size_t es)
      : rows_(std::move(rows)), row_bytes_(row_bytes), es_(es) {}
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const Tensor& src = in[0];
    src.raw_data();  // waits for a queued writer, checks the storage
    const char* base =
        static_cast<const char*>(src.storage()->data()) + src.offset() * int64_t(es_);
    char* d = static_cast<char*>(out[0].raw_data());
    const int64_t n = int64_t(rows_.size()), rb = row_bytes_;
    const int64_t* offs = rows_.data();
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(rb, 1));
    parallel_for(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) std::memcpy(d + r * rb, base + offs[r], size_t(rb));
    });
  }

 private:
  std::vector<int64_t> rows_;  // byte offset of each row from the view's start
  int64_t row_bytes_;
  size_t es_;
};

}  // namespace

std::unique_ptr<PreparedKernel> Copy::prepare_cpu(const std::vector<Tensor>& in,
                                                  const std::vector<Tensor>& out) {
  const Tensor& src = in[0];
  if (src.dtype() != out[0].dtype() || src.ndim() == 0 || src.is_contiguous() ||
      src.strides().back() != 1 || src.numel() == 0)
    return nullptr;
  const size_t es = dtype_size(src.dtype());
  Shape outer(src.shape().begin(), src.shape().end() - 1);
  Strides outer_st(src.strides().begin(), src.strides().end() - 1);
  std::vector<int64_t> rows;
  rows.reserve(size_t(src.numel() / src.shape().back()));
  for_each_offset(outer, outer_st, 0, [&](int64_t off) { rows.push_back(off * int64_t(es)); });
  return std::make_unique<PreparedStridedCopy>(std::move(rows), src.shape().back() * int64_t(es),
                                               es);
}

}  // namespace tessera
