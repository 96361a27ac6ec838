// ApplyRope prepared once for a compiled program (decision 0010) on f32 contiguous rows: eval_cpu
// copies each row into a float buffer and back (convert_elements) and allocates four row
// vectors per call; here the rotation reads and writes the tensors in place. The arithmetic is
// eval_cpu's fp32 branch term for term (two products, then the sum; this file is built for
// baseline x86-64 as rope.cpp, so nothing is contracted into an FMA), hence the same bits.
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/norm_rope/rope_kernels.h"
#include "ops/rope.h"
#include "runtime/cpu_features.h"
#include "runtime/dtype.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

// y = (x0 c0 - x1 s0, x1 c1 + x0 s1) per pair: the products rounded, then one sum (a - b is
// a + (-b) exactly), so the SSE2 form gives the scalar loop's bits four lanes at a time.
void rotate_pairs(const float* x, const float* c, const float* s, float* y, int64_t D) {
  int64_t j = 0;
#ifdef __SSE2__
  const __m128 neg_even = _mm_castsi128_ps(_mm_set_epi32(0, int(0x80000000u), 0, int(0x80000000u)));
  for (; j + 4 <= D; j += 4) {
    const __m128 v = _mm_loadu_ps(x + j);
    const __m128 swapped = _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1));
    const __m128 a = _mm_mul_ps(v, _mm_loadu_ps(c + j));
    const __m128 t = _mm_xor_ps(_mm_mul_ps(swapped, _mm_loadu_ps(s + j)), neg_even);
    _mm_storeu_ps(y + j, _mm_add_ps(a, t));
  }
#endif
  for (; j < D; j += 2) {
    const float x0 = x[j], x1 = x[j + 1];
    y[j] = x0 * c[j] - x1 * s[j];
    y[j + 1] = x1 * c[j + 1] + x0 * s[j + 1];
  }
}

class PreparedRope final : public PreparedKernel {
 public:
  PreparedRope(bool interleaved, int64_t D, int64_t S, int64_t per_s, bool batched,
               int64_t rows_per_batch)
      : interleaved_(interleaved),
        D_(D),
        S_(S),
        per_s_(per_s),
        batched_(batched),
        rows_per_batch_(rows_per_batch) {}

  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const float* src = static_cast<const float*>(in[0].raw_data());
    const float* cos_base = static_cast<const float*>(in[1].raw_data());
    const float* sin_base = static_cast<const float*>(in[2].raw_data());
    float* dst = static_cast<float*>(out[0].raw_data());
    const int64_t D = D_, half = D / 2, rows = out[0].numel() / std::max<int64_t>(D, 1);
    const int64_t grain = std::max<int64_t>(256, 8192 / std::max<int64_t>(D, 1));  // as eval
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      // Row r's table row, kept as counters: two integer divisions per 16-float row cost more
      // than its rotation. Rows come in runs that share a table row (a token's heads).
      int64_t p = b % per_s_, s_idx = (b / per_s_) % S_, in_batch = b % rows_per_batch_,
              batch = b / rows_per_batch_;
      for (int64_t r = b; r < e;) {
        const int64_t run = std::min(e - r, per_s_ - p);
        const int64_t table_row = (batched_ ? batch * S_ : 0) + s_idx;
        const float* cp = cos_base + table_row * D;
        const float* sp = sin_base + table_row * D;
        const float* x = src + r * D;
        float* y = dst + r * D;
        if (interleaved_ && isa_ >= CpuIsa::avx512) {
          cpu::rope_rotate_pairs_f32_avx512(x, cp, sp, y, D, run);
        } else if (interleaved_ && isa_ == CpuIsa::avx2) {
          cpu::rope_rotate_pairs_f32_avx2(x, cp, sp, y, D, run);
        } else {
          for (int64_t i = 0; i < run; ++i, x += D, y += D) {
            if (interleaved_) {
              rotate_pairs(x, cp, sp, y, D);
              continue;
            }
            for (int64_t j = 0; j < half; ++j) y[j] = x[j] * cp[j] - x[j + half] * sp[j];
            for (int64_t j = half; j < D; ++j) y[j] = x[j] * cp[j] + x[j - half] * sp[j];
          }
        }
        r += run;
        // rows_per_batch_ is a multiple of per_s_: a run never crosses a batch.
        if ((p += run) == per_s_) {
          p = 0;
          if (++s_idx == S_) s_idx = 0;
        }
        if ((in_batch += run) == rows_per_batch_) in_batch = 0, ++batch;
      }
    });
  }

 private:
  bool interleaved_;
  CpuIsa isa_ = cpu_isa();
  int64_t D_, S_, per_s_;
  bool batched_;
  int64_t rows_per_batch_;
};

// The tables of the last ids seen, handed out again while the ids' bytes stay the same (the
// positions of a fixed size and prompt length); otherwise eval_cpu runs and they are kept.
class PreparedRopeFrequencies final : public PreparedKernel {
 public:
  PreparedRopeFrequencies(std::vector<int64_t> axes_dim, double theta)
      : axes_dim_(std::move(axes_dim)), theta_(theta) {}
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const size_t id_bytes = size_t(in[0].numel()) * dtype_size(in[0].dtype());
    const size_t tab_bytes = size_t(out[0].numel()) * 4;
    const char* ids = static_cast<const char*>(in[0].raw_data());
    if (!ids_.empty() && std::memcmp(ids_.data(), ids, id_bytes) == 0) {
      std::memcpy(out[0].raw_data(), cos_.data(), tab_bytes);
      std::memcpy(out[1].raw_data(), sin_.data(), tab_bytes);
      return;
    }
    RopeFrequencies(axes_dim_, theta_).eval_cpu(in, out);
    ids_.assign(ids, ids + id_bytes);
    const char* c = static_cast<const char*>(out[0].raw_data());
    const char* s = static_cast<const char*>(out[1].raw_data());
    cos_.assign(c, c + tab_bytes);
    sin_.assign(s, s + tab_bytes);
  }

 private:
  std::vector<int64_t> axes_dim_;
  double theta_;
  std::vector<char> ids_, cos_, sin_;
};

}  // namespace

std::unique_ptr<PreparedKernel> RopeFrequencies::prepare_cpu(const std::vector<Tensor>& in,
                                                             const std::vector<Tensor>& out) {
  if (!in[0].is_contiguous() || in[0].numel() == 0 || out.size() != 2) return nullptr;
  for (const Tensor& o : out)
    if (o.dtype() != DType::f32 || !o.is_contiguous()) return nullptr;
  return std::make_unique<PreparedRopeFrequencies>(axes_dim_, theta_);
}

std::unique_ptr<PreparedKernel> ApplyRope::prepare_cpu(const std::vector<Tensor>& in,
                                                       const std::vector<Tensor>& out) {
  const Tensor &x = in[0], &cos = in[1], &sin = in[2];
  // f32 everywhere: no rounding between the steps in either math mode. In place needs x and
  // out distinct buffers, which a program guarantees (a step never writes its own input).
  for (const Tensor* t : {&x, &cos, &sin, &out[0]})
    if (t->dtype() != DType::f32 || !t->is_contiguous()) return nullptr;
  if (x.ndim() < 2 || x.numel() == 0) return nullptr;
  const int64_t D = x.dim(-1), S = x.dim(sequence_dim_);
  int64_t per_s = 1;
  for (int64_t d = sequence_dim_ + 1; d < x.ndim() - 1; ++d) per_s *= x.dim(d);
  const bool batched = cos.ndim() == 3 && cos.dim(0) > 1;
  const int64_t rows = x.numel() / D;
  return std::make_unique<PreparedRope>(layout_ == RopeLayout::interleaved, D, S, per_s, batched,
                                        rows / x.dim(0));
}

}  // namespace tessera
