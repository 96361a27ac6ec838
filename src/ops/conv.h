// 2-D convolution (torch.nn.functional.conv2d) on NCHW activations and OIHW weights, f32 or bf16
// (fp32 accumulation, output rounded to bf16 once). Runs on oneDNN on the CPU.
#pragma once
#include <array>
#include <cstdint>

#include "runtime/primitive.h"

namespace tessera {

struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1};         // (h, w)
  std::array<int64_t, 4> padding{0, 0, 0, 0};  // (top, bottom, left, right), zero padding
  std::array<int64_t, 2> dilation{1, 1};       // (h, w)
  int64_t groups = 1;
};

class Conv2d final : public Primitive {
 public:
  Conv2d(const Conv2dParams& p, bool has_bias) : p_(p), has_bias_(has_bias) {}
  const char* name() const override { return "conv2d"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;
  const Conv2dParams& params() const { return p_; }
  bool has_bias() const { return has_bias_; }

 private:
  Conv2dParams p_;
  bool has_bias_;
};

// x[N, C, H, W], weight[O, C/groups, kh, kw], optional bias[O] -> [N, O, Ho, Wo].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p);
// Symmetric form, as torch: padding (ph, pw) on both sides of each spatial dim.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0});

}  // namespace tessera
