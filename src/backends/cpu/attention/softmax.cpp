// Softmax on CPU: fp32 math on rows gathered from any layout, one rounding on output.
#include "ops/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/copy.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

void softmax_inplace(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  if (mx == -INFINITY) mx = 0;  // all -inf: exp gives 0/0 = nan, as torch
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - mx);
    sum += x[j];
  }
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

}  // namespace

void Softmax::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor x = in[0];
  if (!x.is_contiguous()) {
    Tensor c = Tensor::empty(x.shape(), x.dtype(), x.device());
    std::vector<Tensor> outs = {c};
    Copy().eval_cpu({x}, outs);
    x = c;
  }
  const int64_t n = x.dim(dim_);
  int64_t inner = 1;
  for (int64_t d = dim_ + 1; d < x.ndim(); ++d) inner *= x.dim(d);
  const int64_t outer = n ? x.numel() / (n * inner) : 0;
  const DType dt = x.dtype();
  const size_t es = dtype_size(dt);
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out[0].raw_data());
  if (inner == 1) {
    parallel_for(
        outer, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
          std::vector<float> row(static_cast<size_t>(n));
          for (int64_t r = b; r < e; ++r) {
            convert_elements(src + r * n * int64_t(es), dt, row.data(), DType::f32, size_t(n));
            softmax_inplace(row.data(), n);
            convert_elements(row.data(), DType::f32, dst + r * n * int64_t(es), dt, size_t(n));
          }
        });
    return;
  }
  // Reduction over a middle dim: gather each column (stride `inner`).
  parallel_for(outer * inner, 16, [&](int64_t b, int64_t e) {
    std::vector<float> col(static_cast<size_t>(n));
    for (int64_t c = b; c < e; ++c) {
      const int64_t base = (c / inner) * n * inner + c % inner;
      for (int64_t j = 0; j < n; ++j)
        convert_elements(src + (base + j * inner) * int64_t(es), dt, &col[j], DType::f32, 1);
      softmax_inplace(col.data(), n);
      for (int64_t j = 0; j < n; ++j)
        convert_elements(&col[j], DType::f32, dst + (base + j * inner) * int64_t(es), dt, 1);
    }
  });
}

}  // namespace tessera
