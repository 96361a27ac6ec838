// Scaled dot-product attention as torch.nn.functional.scaled_dot_product_attention, computed
// tile by tile with an online softmax so the (Lq, Lk) score matrix is never materialised.
#pragma once
#include <optional>

#include "runtime/primitive.h"

namespace tessera {

struct SdpaOptions {
  // Top-left aligned as torch's is_causal: query i sees keys j <= i. May be combined with mask.
  bool causal = false;
  // Multiplies q.k; default 1/sqrt(head_dim). T5 passes 1.0.
  std::optional<double> scale;
  // Optional, broadcastable to (B, H, Lq, Lk): bool (true = attend) or an additive bias of a
  // floating dtype (added to the scaled scores, e.g. T5's position bias or a padding mask).
  Tensor mask;
};

class ScaledDotProductAttention final : public Primitive {
 public:
  ScaledDotProductAttention(bool causal, double scale, bool has_mask)
      : causal_(causal), scale_(scale), has_mask_(has_mask) {}
  const char* name() const override { return "scaled_dot_product_attention"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& other) const override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;

  bool causal() const { return causal_; }
  double scale() const { return scale_; }
  bool has_mask() const { return has_mask_; }

 private:
  bool causal_;
  double scale_;
  bool has_mask_;
};

// q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) with H % Hkv == 0 (grouped-query
// attention: head h reads kv head h / (H / Hkv), as repeat_kv / enable_gqa=True). All three share
// one dtype (f32 or bf16); the result is (B, H, Lq, Dv) in that dtype, accumulated in fp32.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options = {});

}  // namespace tessera
