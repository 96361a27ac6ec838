// Normalisations: layer norm, RMS norm (diffusers/T5 and Llama/Mistral cast orders) and group
// norm. Statistics are computed in fp32 (long rows summed in chunks with a double total); bf16
// outputs round once, except where the reference module rounds an intermediate.
#pragma once
#include "runtime/primitive.h"

namespace tessera {

// Norms over the last dim of a contiguous input fuse row-wise (runtime/fusion.h).
Fusion rowwise_fusion(const std::vector<Tensor>& in);

// Over the last dim; weight/bias optional ([D], any float dtype). y = (x - mean) * rstd * w + b,
// evaluated as torch's CPU kernel does: (x * rstd - mean * rstd) * w + b.
class LayerNorm final : public Primitive {
 public:
  LayerNorm(double eps, bool has_weight, bool has_bias)
      : eps_(eps), has_weight_(has_weight), has_bias_(has_bias) {}
  const char* name() const override { return "layer_norm"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  Fusion fusion(const std::vector<Tensor>& in) const override { return rowwise_fusion(in); }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }
  // eval_cpu's bits on f32 rows of d <= kEwChunk elements (row r at x + r * d), weight and bias
  // f32 or null: what a fused kernel computes straight into its chunk buffer.
  void f32_rows(const float* x, int64_t rows, int64_t d, const float* w, const float* b,
                float* o) const;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;

  double eps() const { return eps_; }

 private:
  double eps_;
  bool has_weight_, has_bias_;
};

// diffusers RMSNorm and transformers T5LayerNorm: h = x * rsqrt(mean(x^2) + eps) in fp32, cast
// to the weight's dtype when that is bf16/f16, then h * w (so bf16 x with f32 w gives f32).
// Without a weight: h cast to x's dtype.
// llama: transformers' Llama/Mistral RMSNorm: w * h.to(x.dtype) (output promote(w, x)).
enum class RmsNormStyle : uint8_t { diffusers, llama };

class RmsNorm final : public Primitive {
 public:
  RmsNorm(double eps, RmsNormStyle style, bool has_weight)
      : eps_(eps), style_(style), has_weight_(has_weight) {}
  const char* name() const override { return "rms_norm"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  Fusion fusion(const std::vector<Tensor>& in) const override { return rowwise_fusion(in); }
  bool has_weight() const { return has_weight_; }
  // As LayerNorm::f32_rows (f32 x and weight: neither style rounds in between).
  void f32_rows(const float* x, int64_t rows, int64_t d, const float* w, float* o) const;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;

  double eps() const { return eps_; }
  RmsNormStyle style() const { return style_; }

 private:
  double eps_;
  RmsNormStyle style_;
  bool has_weight_;
};

// x[N, C, *spatial] in `groups` groups of C/groups channels; per-channel weight/bias optional.
// As torch: y = x * (rstd * w[c]) + (b[c] - rstd * w[c] * mean).
class GroupNorm final : public Primitive {
 public:
  GroupNorm(int64_t groups, double eps, bool has_weight, bool has_bias)
      : groups_(groups), eps_(eps), has_weight_(has_weight), has_bias_(has_bias) {}
  const char* name() const override { return "group_norm"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;

  int64_t groups() const { return groups_; }
  double eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }

 private:
  int64_t groups_;
  double eps_;
  bool has_weight_, has_bias_;
};

// F.layer_norm(x, (D,), weight, bias, eps); pass undefined tensors for elementwise_affine=False.
Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps,
                RmsNormStyle style = RmsNormStyle::diffusers);
// F.group_norm(x, groups, weight, bias, eps).
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace tessera
