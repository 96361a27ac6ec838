// FluxTransformer2DModel (diffusers/models/transformers/transformer_flux.py) for the FLUX.1-schnell
// and FLUX.1-dev configs: 19 double-stream and 38 single-stream blocks at full size.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/attention.h"
#include "nn/embeddings.h"
#include "nn/feed_forward.h"
#include "nn/layers.h"
#include "nn/normalization.h"
#include "nn/pretrained.h"

namespace tessera {

// The transformer's config.json, with diffusers' defaults for the keys that do not change shapes.
struct FluxTransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;  // null in config.json means in_channels
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope{16, 56, 56};

  // Shape keys are required; unsupported values are refused naming the key and the value.
  static FluxTransformerConfig from_json(const JsonConfig& config);
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
};

// The output pair of both block kinds, in diffusers' order (encoder_hidden_states first).
struct FluxBlockOutput {
  Tensor encoder_hidden_states, hidden_states;
};

// FluxTransformerBlock: the double-stream (MMDiT) block.
class FluxTransformerBlock : public Module {
 public:
  FluxTransformerBlock(int64_t dim, int64_t num_attention_heads, int64_t attention_head_dim);
  FluxBlockOutput operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                             const Tensor& temb, const nn::RotaryEmbedding& rotary) const;
  nn::AdaLayerNormZero norm1, norm1_context;
  nn::Attention attn;
  nn::LayerNorm norm2, norm2_context;
  nn::FeedForward ff, ff_context;

 private:
  FluxBlockOutput forward_impl(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                               const Tensor& temb, const nn::RotaryEmbedding& rotary) const;
};

// FluxSingleTransformerBlock: the single-stream block over [text, image].
class FluxSingleTransformerBlock : public Module {
 public:
  FluxSingleTransformerBlock(int64_t dim, int64_t num_attention_heads, int64_t attention_head_dim,
                             double mlp_ratio = 4.0);
  FluxBlockOutput operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                             const Tensor& temb, const nn::RotaryEmbedding& rotary) const;
  // The same on the joint sequence cat([text, image], 1), returned joint: consecutive single
  // blocks pass it on without diffusers' split and re-concatenation (same values, no copy).
  Tensor forward_joint(const Tensor& joint, const Tensor& temb,
                       const nn::RotaryEmbedding& rotary) const;
  int64_t mlp_hidden_dim;
  nn::AdaLayerNormZeroSingle norm;
  nn::Linear proj_mlp;
  nn::Linear proj_out;
  nn::Attention attn;

 private:
  Tensor forward_joint_impl(const Tensor& joint, const Tensor& temb,
                            const nn::RotaryEmbedding& rotary) const;
};

// Named as the arguments of diffusers' FluxTransformer2DModel.forward.
struct FluxTransformerInputs {
  Tensor hidden_states;          // (B, L_img, in_channels)
  Tensor encoder_hidden_states;  // (B, L_txt, joint_attention_dim)
  Tensor pooled_projections;     // (B, pooled_projection_dim)
  Tensor timestep;               // (B,), already divided by 1000 (the model multiplies by 1000)
  Tensor img_ids;                // (L_img, 3)
  Tensor txt_ids;                // (L_txt, 3)
  Tensor guidance;               // (B,), only with guidance_embeds (FLUX.1-dev)
};

class FluxTransformer2DModel : public Module {
 public:
  explicit FluxTransformer2DModel(const FluxTransformerConfig& config);
  // Reads <folder>/config.json and loads the checkpoint converted to `dtype` (f32 or bf16).
  // `tp`: split over its ranks by tp_plan(), each rank reading only its slices.
  static std::unique_ptr<FluxTransformer2DModel> from_pretrained(
      const std::string& component_folder, DType dtype, const TensorParallelConfig* tp = nullptr) {
    return load_pretrained<FluxTransformer2DModel>(component_folder, dtype, tp);
  }
  // diffusers' FluxTransformer2DModel._tp_plan: q/k/v (both streams) and MLP-in column-wise,
  // attention outputs and MLP-out row-wise (then all-reduced); the single blocks' proj_out reads
  // [attention, MLP] fused, so it is split packed. Heads stay whole on a rank.
  TensorParallelPlan tp_plan() const;
  // For load_pretrained (nn/pretrained.h).
  static constexpr const char* kPretrainedName = "[FluxTransformer2DModel]";
  static FluxTransformerConfig config_from_json(const JsonConfig& c) {
    return FluxTransformerConfig::from_json(c);
  }
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }

  // Returns `sample` (B, L_img, patch_size^2 * out_channels) in the model dtype. With `capture`,
  // records the activations diffusers' goldens name: x_embedder, context_embedder,
  // time_text_embed, pos_embed.cos/sin, transformer_blocks.N.{encoder_,}hidden_states,
  // single_transformer_blocks.N.{encoder_,}hidden_states, norm_out, proj_out.
  // The whole forward and each block go through Module::call, so what is set on them from
  // outside (programs, hooks) applies; captured activations are then extra outputs.
  Tensor forward(const FluxTransformerInputs& inputs,
                 std::map<std::string, Tensor>* capture = nullptr) const;
  // diffusers' _repeated_blocks: the block classes the layers repeat.
  std::vector<std::string> repeated_blocks() const override {
    return {"FluxTransformerBlock", "FluxSingleTransformerBlock"};
  }
  // The names forward's `capture` fills, in a fixed order.
  std::vector<std::string> capture_names() const;

  DType dtype() const { return dtype_; }

  FluxTransformerConfig config;
  nn::FluxPosEmbed pos_embed;
  nn::CombinedTimestepTextProjEmbeddings time_text_embed;
  nn::Linear context_embedder;
  nn::Linear x_embedder;
  // The repeated blocks.
  std::vector<std::unique_ptr<FluxTransformerBlock>> transformer_blocks;
  std::vector<std::unique_ptr<FluxSingleTransformerBlock>> single_transformer_blocks;
  nn::AdaLayerNormContinuous norm_out;
  nn::Linear proj_out;

 private:
  Tensor forward_eager(const FluxTransformerInputs& inputs,
                       std::map<std::string, Tensor>* capture) const;
  DType dtype_ = DType::f32;
};

// The name tests and callers used before the blocks moved to nn/.
namespace flux {
using RotaryEmbedding = nn::RotaryEmbedding;
}  // namespace flux

}  // namespace tessera
