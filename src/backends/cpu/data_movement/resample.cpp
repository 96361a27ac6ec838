// CPU nearest upsampling: each output row repeats every input element `factor` times.
#include "ops/resample.h"

#include <cstring>

#include "ops/copy.h"
#include "runtime/parallel.h"

namespace tessera {

namespace {
template <typename T>
void upsample_rows(const T* src, T* dst, int64_t rows, int64_t w, int64_t f) {
  const int64_t ow = w * f;
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* s = src + r * w;
      T* d = dst + r * f * ow;
      for (int64_t x = 0; x < w; ++x)
        for (int64_t k = 0; k < f; ++k) d[x * f + k] = s[x];
      for (int64_t k = 1; k < f; ++k) std::memcpy(d + k * ow, d, size_t(ow) * sizeof(T));
    }
  });
}
}  // namespace

void UpsampleNearest::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  const int64_t w = x.shape()[3];
  const int64_t rows = w ? x.numel() / w : 0;
  switch (dtype_size(x.dtype())) {
    case 1:
      upsample_rows(x.data<uint8_t>(), out[0].data<uint8_t>(), rows, w, factor_);
      break;
    case 2:
      upsample_rows(x.data<uint16_t>(), out[0].data<uint16_t>(), rows, w, factor_);
      break;
    case 4:
      upsample_rows(x.data<uint32_t>(), out[0].data<uint32_t>(), rows, w, factor_);
      break;
    default:
      upsample_rows(x.data<uint64_t>(), out[0].data<uint64_t>(), rows, w, factor_);
      break;
  }
}

}  // namespace tessera
