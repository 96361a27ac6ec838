// RmsNorm prepared once for a compiled program (decision 0010) on its common small case: f32
// rows of at most one chunk (FLUX's per-head q/k norms: 16-128 wide), f32 or no weight. Eager's
// eval_cpu pays per call a weight copy to floats; here the weight is read in place and the rows
// go through the table's rms_norm_rows (the row kernels eval_cpu uses, so the same bits).
#include <cmath>

#include "backends/cpu/elementwise/elementwise_kernels.h"
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
                   k.rms_norm_rows(x + r0 * d, r1 - r0, d, eps, w, o + r0 * d);
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
