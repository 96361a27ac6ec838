// CPU embedding gather and sinusoidal timestep embedding.
#include "ops/embedding.h"

#include <cmath>
#include <cstring>

#include "ops/copy.h"
#include "runtime/error.h"
#include "runtime/parallel.h"

namespace tessera {

void Embedding::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor w = contiguous(in[0]);
  const std::vector<int64_t> ids = in[1].to_ints();
  const int64_t v = w.shape()[0], d = w.shape()[1];
  // Checked before the parallel copy: an exception must not leave an OpenMP region.
  for (size_t i = 0; i < ids.size(); ++i)
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < v, "[embedding] id ", ids[i], " at flat index ", i,
                  " is out of range for a table of ", v, " rows, expected 0 <= id < ", v);
  const size_t row = size_t(d) * dtype_size(w.dtype());
  const char* src = static_cast<const char*>(w.raw_data());
  char* dst = static_cast<char*>(out[0].raw_data());
  parallel_for(int64_t(ids.size()), 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(dst + i * row, src + ids[i] * row, row);
  });
}

void TimestepEmbedding::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const std::vector<float> t = in[0].to_floats();
  const int64_t half = dim_ / 2;
  // As diffusers: exponent = -log(max_period) * arange(half) / (half - shift); emb = exp(.);
  // each step is one fp32 torch op (the scalars become fp32).
  const float neg_log = float(-std::log(max_period_));
  const float denom = float(double(half) - shift_);
  std::vector<float> freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) freq[i] = std::exp((float(i) * neg_log) / denom);
  const float scale = float(scale_);
  float* o = out[0].data<float>();
  for (size_t n = 0; n < t.size(); ++n) {
    float* row = o + int64_t(n) * dim_;
    float* sin_part = row + (flip_ ? half : 0);
    float* cos_part = row + (flip_ ? 0 : half);
    for (int64_t i = 0; i < half; ++i) {
      const float arg = scale * (t[n] * freq[i]);
      sin_part[i] = std::sin(arg);
      cos_part[i] = std::cos(arg);
    }
    if (dim_ % 2) row[dim_ - 1] = 0.f;
  }
}

}  // namespace tessera
