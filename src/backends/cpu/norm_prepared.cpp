// RmsNorm prepared once for a compiled program (decision 0010) on its common small case: f32
// rows of at most one chunk (FLUX's per-head q/k norms: 16-128 wide), f32 or no weight. Eager's
// eval_cpu pays per call a weight copy to floats and per row a load, two table calls for the
// multiplies and a store copy; here each row is one table sum_sq call (the same function, so
// the same 16-lane order and bits) and an inline scale-and-weight loop (x * r, then * w: the
// same two roundings as the two binary calls).
#include <cmath>

#include "backends/cpu/elementwise_kernels.h"
#include "ops/norm.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

class PreparedRmsNorm final : public PreparedKernel {
 public:
  PreparedRmsNorm(int64_t d, float eps) : d_(d), eps_(eps) {}
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const float* x = static_cast<const float*>(in[0].raw_data());
    const float* w = in.size() > 1 ? static_cast<const float*>(in[1].raw_data()) : nullptr;
    float* o = static_cast<float*>(out[0].raw_data());
    const int64_t d = d_, rows = d ? out[0].numel() / d : 0;
    const EwKernels& k = ew_kernels();
    const float eps = eps_;
    parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     const float* xr = x + r * d;
                     float* orow = o + r * d;
                     const double ss = k.sum_sq(xr, d);
                     const float var = float(ss) / float(d);
                     const float rr = 1.f / std::sqrt(var + eps);
                     if (w) {
                       for (int64_t j = 0; j < d; ++j) {
                         const float t = xr[j] * rr;
                         orow[j] = t * w[j];
                       }
                     } else {
                       for (int64_t j = 0; j < d; ++j) orow[j] = xr[j] * rr;
                     }
                   }
                 });
  }

 private:
  int64_t d_;
  float eps_;
};

}  // namespace

std::unique_ptr<PreparedKernel> RmsNorm::prepare_cpu(const std::vector<Tensor>& in,
                                                     const std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  if (x.dtype() != DType::f32 || out[0].dtype() != DType::f32 || !x.is_contiguous()) return nullptr;
  if (x.ndim() == 0) return nullptr;
  const int64_t d = x.shape().back();
  if (d <= 0 || d > kEwChunk) return nullptr;
  if (has_weight_) {
    const Tensor& w = in[1];
    if (w.dtype() != DType::f32 || w.ndim() != 1 || !w.is_contiguous()) return nullptr;
  }
  // f32 input and weight: neither style rounds in between (round_to_w needs a 16-bit weight,
  // round_to_x rounds f32 to f32).
  return std::make_unique<PreparedRmsNorm>(d, float(eps_));
}

}  // namespace tessera
