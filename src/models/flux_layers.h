// The building blocks of diffusers' FluxTransformer2DModel (transformer_flux.py, embeddings.py,
// normalization.py, attention.py), with diffusers' module and parameter names so checkpoint keys
// map onto members. forward functions only call ops.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::flux {

// FluxPosEmbed's output: f32 (L, head_dim) tables, each frequency repeated twice (interleaved).
struct RotaryEmbedding {
  Tensor cos, sin;
};

// FluxPosEmbed(theta, axes_dim): per-axis frequencies in float64, cos/sin rounded to f32.
class FluxPosEmbed {
 public:
  FluxPosEmbed(double theta, std::vector<int64_t> axes_dim)
      : theta(theta), axes_dim(std::move(axes_dim)) {}
  // ids (L, n_axes) with n_axes == axes_dim.size().
  RotaryEmbedding operator()(const Tensor& ids) const;
  double theta;
  std::vector<int64_t> axes_dim;
};

// diffusers TimestepEmbedding(in_channels, time_embed_dim) with SiLU: linear_1 -> silu -> linear_2.
class TimestepEmbedding : public Module {
 public:
  TimestepEmbedding(int64_t in_channels, int64_t time_embed_dim);
  Tensor operator()(const Tensor& sample) const;
  nn::Linear linear_1, linear_2;
};

// PixArtAlphaTextProjection(in_features, hidden_size, act_fn="silu").
class PixArtAlphaTextProjection : public Module {
 public:
  PixArtAlphaTextProjection(int64_t in_features, int64_t hidden_size);
  Tensor operator()(const Tensor& caption) const;
  nn::Linear linear_1, linear_2;
};

// CombinedTimestepTextProjEmbeddings, or CombinedTimestepGuidanceTextProjEmbeddings when
// `guidance_embeds` (FLUX.1-dev): Timesteps(256, flip_sin_to_cos=True, shift 0) -> MLPs, plus the
// pooled text projection.
class CombinedTimestepTextProjEmbeddings : public Module {
 public:
  CombinedTimestepTextProjEmbeddings(int64_t embedding_dim, int64_t pooled_projection_dim,
                                     bool guidance_embeds);
  // timestep/guidance (B,) already scaled by 1000; guidance only with guidance_embeds.
  Tensor operator()(const Tensor& timestep, const Tensor& guidance,
                    const Tensor& pooled_projection) const;
  bool guidance_embeds;
  TimestepEmbedding timestep_embedder;
  std::unique_ptr<TimestepEmbedding> guidance_embedder;  // null without guidance_embeds
  PixArtAlphaTextProjection text_embedder;
};

// AdaLayerNormZero(dim): linear(silu(emb)) -> 6 chunks; LayerNorm(eps 1e-6, no affine) modulated.
class AdaLayerNormZero : public Module {
 public:
  explicit AdaLayerNormZero(int64_t embedding_dim);
  struct Output {
    Tensor x, gate_msa, shift_mlp, scale_mlp, gate_mlp;
  };
  Output operator()(const Tensor& x, const Tensor& emb) const;
  nn::Linear linear;
  nn::LayerNorm norm;
};

// AdaLayerNormZeroSingle(dim): 3 chunks (shift, scale, gate).
class AdaLayerNormZeroSingle : public Module {
 public:
  explicit AdaLayerNormZeroSingle(int64_t embedding_dim);
  struct Output {
    Tensor x, gate_msa;
  };
  Output operator()(const Tensor& x, const Tensor& emb) const;
  nn::Linear linear;
  nn::LayerNorm norm;
};

// AdaLayerNormContinuous(dim, cond_dim, elementwise_affine=False, eps): chunks in the order
// (scale, shift), unlike AdaLayerNormZero.
class AdaLayerNormContinuous : public Module {
 public:
  AdaLayerNormContinuous(int64_t embedding_dim, int64_t conditioning_embedding_dim, double eps);
  Tensor operator()(const Tensor& x, const Tensor& conditioning_embedding) const;
  nn::Linear linear;
  nn::LayerNorm norm;
};

// diffusers GELU(dim_in, dim_out, approximate="tanh"): proj then gelu.
class GeluProjection : public Module {
 public:
  GeluProjection(int64_t dim_in, int64_t dim_out);
  Tensor operator()(const Tensor& x) const;
  nn::Linear proj;
};

// FeedForward(dim, dim_out, activation_fn="gelu-approximate"): net.0 (GELU), net.2 (Linear).
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t dim_out, int64_t mult = 4);
  Tensor operator()(const Tensor& x) const;
  GeluProjection act;  // net.0
  nn::Linear out;      // net.2
};

// torch.nn.RMSNorm(dim, eps): unlike diffusers' RMSNorm, torch multiplies by the weight in fp32
// and rounds once (checked on torch's CPU kernel), so the weight is applied as f32.
class TorchRMSNorm : public Module {
 public:
  TorchRMSNorm(int64_t dim, double eps);
  Tensor operator()(const Tensor& x) const;
  double eps;
  Tensor weight;
};

// FluxAttention with FluxAttnProcessor. Double-stream blocks have the added (context)
// projections; single-stream blocks are pre_only (no to_out).
class FluxAttention : public Module {
 public:
  FluxAttention(int64_t query_dim, int64_t heads, int64_t dim_head, bool added_kv_proj,
                bool pre_only, double eps);
  struct Output {
    Tensor hidden_states, encoder_hidden_states;  // the second only with added projections
  };
  // hidden_states (B, L, D); encoder_hidden_states (B, T, D) only with added projections: the
  // joint sequence is [text, image].
  Output operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                    const RotaryEmbedding* rotary) const;

  int64_t heads, head_dim;
  bool added_kv_proj, pre_only;
  TorchRMSNorm norm_q, norm_k;
  nn::Linear to_q, to_k, to_v;
  std::unique_ptr<nn::Linear> to_out_0;
  std::unique_ptr<TorchRMSNorm> norm_added_q, norm_added_k;
  std::unique_ptr<nn::Linear> add_q_proj, add_k_proj, add_v_proj, to_add_out;
};

// The output pair of both block kinds, in diffusers' order (encoder_hidden_states first).
struct BlockOutput {
  Tensor encoder_hidden_states, hidden_states;
};

// FluxTransformerBlock: the double-stream (MMDiT) block.
class FluxTransformerBlock : public Module {
 public:
  FluxTransformerBlock(int64_t dim, int64_t num_attention_heads, int64_t attention_head_dim);
  BlockOutput operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                         const Tensor& temb, const RotaryEmbedding& rotary) const;
  AdaLayerNormZero norm1, norm1_context;
  FluxAttention attn;
  nn::LayerNorm norm2, norm2_context;
  FeedForward ff, ff_context;

 private:
  BlockOutput forward_impl(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                           const Tensor& temb, const RotaryEmbedding& rotary) const;
};

// FluxSingleTransformerBlock: the single-stream block over [text, image].
class FluxSingleTransformerBlock : public Module {
 public:
  FluxSingleTransformerBlock(int64_t dim, int64_t num_attention_heads, int64_t attention_head_dim,
                             double mlp_ratio = 4.0);
  BlockOutput operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                         const Tensor& temb, const RotaryEmbedding& rotary) const;
  // The same on the joint sequence cat([text, image], 1), returned joint: consecutive single
  // blocks pass it on without diffusers' split and re-concatenation (same values, no copy).
  Tensor forward_joint(const Tensor& joint, const Tensor& temb,
                       const RotaryEmbedding& rotary) const;
  int64_t mlp_hidden_dim;
  AdaLayerNormZeroSingle norm;
  nn::Linear proj_mlp;
  nn::Linear proj_out;
  FluxAttention attn;

 private:
  Tensor forward_joint_impl(const Tensor& joint, const Tensor& temb,
                            const RotaryEmbedding& rotary) const;
};

}  // namespace tessera::flux
