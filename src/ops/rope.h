// Rotary position embeddings as diffusers computes and applies them: multi-axis frequency tables
// from position ids (FluxPosEmbed / Flux2PosEmbed) and the rotation of q/k (apply_rotary_emb,
// and transformers' rotate_half for Mistral).
#pragma once
#include <utility>
#include <vector>

#include "runtime/primitive.h"

namespace tessera {

enum class RopeLayout {
  interleaved,   // pairs (x[2i], x[2i+1]); diffusers use_real_unbind_dim=-1 (FLUX.1, FLUX.2)
  split_halves,  // pairs (x[i], x[i + D/2]); rotate_half / use_real_unbind_dim=-2 (Mistral)
};

enum class RopeMath {
  fp32,         // x.float() * cos + rotated.float() * sin, rounded once (diffusers)
  input_dtype,  // every product and the sum rounded to x's dtype, cos/sin too (transformers)
};

class RopeFrequencies final : public Primitive {
 public:
  RopeFrequencies(std::vector<int64_t> axes_dim, double theta)
      : axes_dim_(std::move(axes_dim)), theta_(theta) {}
  const char* name() const override { return "rope_frequencies"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  // Remembers the last ids and tables: a denoising loop asks for the same positions every step.
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& other) const override;

  const std::vector<int64_t>& axes_dim() const { return axes_dim_; }
  double theta() const { return theta_; }

 private:
  std::vector<int64_t> axes_dim_;
  double theta_;
};

class ApplyRope final : public Primitive {
 public:
  ApplyRope(RopeLayout layout, RopeMath math, int64_t sequence_dim)
      : layout_(layout), math_(math), sequence_dim_(sequence_dim) {}
  const char* name() const override { return "apply_rope"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& other) const override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;

  RopeLayout layout() const { return layout_; }
  RopeMath math() const { return math_; }
  int64_t sequence_dim() const { return sequence_dim_; }

 private:
  RopeLayout layout_;
  RopeMath math_;
  int64_t sequence_dim_;
};

// cos and sin tables, f32 (L, sum(axes_dim)) from ids (L, n_axes), or (B, L, sum) from
// (B, L, n_axes): axis a uses ids[..., a] and axes_dim[a] columns, each frequency repeated
// twice (interleaved), computed in float64 and rounded to f32 exactly as diffusers does on CPU.
// ids may have more columns than axes (FLUX.2 loops over axes_dim).
std::pair<Tensor, Tensor> rope_frequencies(const Tensor& ids, const std::vector<int64_t>& axes_dim,
                                           double theta);

// Rotates x (..., D) by cos/sin of shape (S, D) or (B, S, D), where S = x.dim(sequence_dim) and
// B = x.dim(0). diffusers' FLUX attention passes x as (B, S, H, D) with sequence_dim 1.
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeLayout layout,
                  int64_t sequence_dim = 2, RopeMath math = RopeMath::fp32);

}  // namespace tessera
