// Flux2Transformer2DModel (diffusers/models/transformers/transformer_flux2.py), FLUX.2-dev's
// denoiser: 8 double-stream and 48 single-stream blocks at full size, no biases anywhere, the
// AdaLN modulation computed once per forward at model level and shared by every block, SwiGLU
// feed-forwards, single blocks with fused QKV+MLP-in and attn-out+MLP-out projections, 4-axis
// RoPE and a guidance embedding.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/attention.h"
#include "nn/embeddings.h"
#include "nn/layers.h"
#include "nn/normalization.h"
#include "nn/pretrained.h"

namespace tessera {

// The transformer's config.json, with diffusers' defaults for the keys that do not change shapes.
struct Flux2TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;  // null in config.json means in_channels
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope{32, 32, 32, 32};
  double rope_theta = 2000;
  double eps = 1e-6;
  bool guidance_embeds = true;

  // Shape keys are required; unsupported values are refused naming the key and the value.
  static Flux2TransformerConfig from_json(const JsonConfig& config);
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t mlp_hidden_dim() const { return int64_t(double(inner_dim()) * mlp_ratio); }
};

// Flux2FeedForward: linear_in (dim -> 2 * inner), SwiGLU (silu of the first half times the
// second), linear_out (inner -> dim); no biases.
class Flux2FeedForward : public Module {
 public:
  Flux2FeedForward(int64_t dim, int64_t inner_dim);
  Tensor operator()(const Tensor& x) const;
  nn::Linear linear_in, linear_out;
};

// Flux2Modulation: linear(silu(temb)) -> 3 * sets chunks (shift, scale, gate per set).
class Flux2Modulation : public Module {
 public:
  Flux2Modulation(int64_t dim, int64_t sets);
  Tensor operator()(const Tensor& temb) const;
  nn::Linear linear;
};

// Flux2TimestepGuidanceEmbeddings: sinusoidal timestep (and guidance) projections through
// bias-free TimestepEmbedding MLPs, summed.
class Flux2TimestepGuidanceEmbeddings : public Module {
 public:
  Flux2TimestepGuidanceEmbeddings(int64_t in_channels, int64_t dim, bool guidance_embeds);
  // timestep / guidance (B,) already scaled by 1000, in the activation dtype.
  Tensor operator()(const Tensor& timestep, const Tensor& guidance) const;
  nn::Timesteps time_proj;
  nn::TimestepEmbedding timestep_embedder;
  std::unique_ptr<nn::TimestepEmbedding> guidance_embedder;  // null without guidance_embeds
};

// The pair both block kinds of FLUX.2 return in diffusers' order; the attention outputs only
// when the caller asks for them (goldens record them).
struct Flux2BlockOutput {
  Tensor encoder_hidden_states, hidden_states;
  Tensor attn_encoder_hidden_states, attn_hidden_states;
};

// Flux2TransformerBlock: the double-stream block, modulated by the model's shared parameters.
class Flux2TransformerBlock : public Module {
 public:
  Flux2TransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden,
                        double eps);
  // mod_img / mod_txt: (B, 6 * dim) from the model's double-stream modulations.
  Flux2BlockOutput operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                              const Tensor& mod_img, const Tensor& mod_txt,
                              const nn::RotaryEmbedding& rotary, bool with_attn = false) const;
  nn::LayerNorm norm1, norm1_context;
  nn::Attention attn;
  nn::LayerNorm norm2, norm2_context;
  Flux2FeedForward ff, ff_context;

 private:
  Flux2BlockOutput forward_impl(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                const Tensor& mod_img, const Tensor& mod_txt,
                                const nn::RotaryEmbedding& rotary) const;
};

// Flux2ParallelSelfAttention: to_qkv_mlp_proj (q, k, v, gate, up), RMS qk-norm, RoPE, SDPA,
// SwiGLU on the MLP half, to_out over [attention, mlp].
class Flux2ParallelSelfAttention : public Module {
 public:
  Flux2ParallelSelfAttention(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden,
                             double eps);
  Tensor operator()(const Tensor& x, const nn::RotaryEmbedding& rotary) const;
  int64_t heads, head_dim, mlp_hidden_dim;
  nn::Linear to_qkv_mlp_proj;
  nn::TorchRMSNorm norm_q, norm_k;
  nn::Linear to_out;
};

// Flux2SingleTransformerBlock on the joint [text, image] sequence.
class Flux2SingleTransformerBlock : public Module {
 public:
  Flux2SingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden,
                              double eps);
  // joint (B, L_txt + L_img, dim); mod (B, 3 * dim). Returns the joint sequence in
  // hidden_states (and the attention output in attn_hidden_states when asked).
  Flux2BlockOutput operator()(const Tensor& joint, const Tensor& mod,
                              const nn::RotaryEmbedding& rotary, bool with_attn = false) const;
  nn::LayerNorm norm;
  Flux2ParallelSelfAttention attn;

 private:
  Flux2BlockOutput forward_impl(const Tensor& joint, const Tensor& mod,
                                const nn::RotaryEmbedding& rotary) const;
};

// Named as the arguments of diffusers' Flux2Transformer2DModel.forward.
struct Flux2TransformerInputs {
  Tensor hidden_states;          // (B, L_img, in_channels)
  Tensor encoder_hidden_states;  // (B, L_txt, joint_attention_dim)
  Tensor timestep;               // (B,), already divided by 1000
  Tensor img_ids;                // (L_img, 4) or (B, L_img, 4), of which the first row is used
  Tensor txt_ids;                // (L_txt, 4) or (B, L_txt, 4)
  Tensor guidance;               // (B,), used only with guidance_embeds
};

class Flux2Transformer2DModel : public Module {
 public:
  explicit Flux2Transformer2DModel(const Flux2TransformerConfig& config);
  // `tp`: split over its ranks by tp_plan(), each rank reading only its slices.
  static std::unique_ptr<Flux2Transformer2DModel> from_pretrained(
      const std::string& component_folder, DType dtype, const TensorParallelConfig* tp = nullptr) {
    return load_pretrained<Flux2Transformer2DModel>(component_folder, dtype, tp);
  }
  // diffusers' Flux2Transformer2DModel._tp_plan: q/k/v of both streams and the SwiGLU MLP-in
  // ([gate, up], packed) column-wise, attention outputs and MLP-out row-wise; the single blocks'
  // fused to_qkv_mlp_proj ([q, k, v, gate, up]) column-wise packed and to_out ([attention, MLP])
  // row-wise packed. Modulations and embedders stay whole.
  TensorParallelPlan tp_plan() const;
  // For load_pretrained (nn/pretrained.h).
  static constexpr const char* kPretrainedName = "[Flux2Transformer2DModel]";
  static Flux2TransformerConfig config_from_json(const JsonConfig& c) {
    return Flux2TransformerConfig::from_json(c);
  }
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }

  // Returns `sample` (B, L_img, patch_size^2 * out_channels) in the model dtype. With `capture`,
  // records what diffusers' goldens name (capture_names()). The forward and each block go
  // through Module::call; captured activations are extra outputs.
  Tensor forward(const Flux2TransformerInputs& inputs,
                 std::map<std::string, Tensor>* capture = nullptr) const;
  std::vector<std::string> repeated_blocks() const override {
    return {"Flux2TransformerBlock", "Flux2SingleTransformerBlock"};
  }
  std::vector<std::string> capture_names() const;
  DType dtype() const { return dtype_; }

  Flux2TransformerConfig config;
  nn::FluxPosEmbed pos_embed;  // Flux2PosEmbed: the same tables, one column per axis
  Flux2TimestepGuidanceEmbeddings time_guidance_embed;
  Flux2Modulation double_stream_modulation_img, double_stream_modulation_txt;
  Flux2Modulation single_stream_modulation;
  nn::Linear x_embedder, context_embedder;
  std::vector<std::unique_ptr<Flux2TransformerBlock>> transformer_blocks;
  std::vector<std::unique_ptr<Flux2SingleTransformerBlock>> single_transformer_blocks;
  nn::AdaLayerNormContinuous norm_out;
  nn::Linear proj_out;

 private:
  Tensor forward_eager(const Flux2TransformerInputs& inputs,
                       std::map<std::string, Tensor>* capture) const;
  DType dtype_ = DType::f32;
};

}  // namespace tessera
