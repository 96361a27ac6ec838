// FluxTransformer2DModel (diffusers/models/transformers/transformer_flux.py) for the FLUX.1-schnell
// and FLUX.1-dev configs: 19 double-stream and 38 single-stream blocks at full size.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "models/flux_layers.h"

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
  static std::unique_ptr<FluxTransformer2DModel> from_pretrained(
      const std::string& component_folder, DType dtype);

  // Returns `sample` (B, L_img, patch_size^2 * out_channels) in the model dtype. With `capture`,
  // records the activations diffusers' goldens name: x_embedder, context_embedder,
  // time_text_embed, pos_embed.cos/sin, transformer_blocks.N.{encoder_,}hidden_states,
  // single_transformer_blocks.N.{encoder_,}hidden_states, norm_out, proj_out.
  // Runs as one compiled program after compile() (with `capture`, a second program whose
  // outputs include the activations), and per block after compile_repeated_blocks().
  Tensor forward(const FluxTransformerInputs& inputs,
                 std::map<std::string, Tensor>* capture = nullptr) const;
  // diffusers' _repeated_blocks.
  std::vector<std::string> repeated_blocks() const override {
    return {"FluxTransformerBlock", "FluxSingleTransformerBlock"};
  }
  // The names forward's `capture` fills, in a fixed order.
  std::vector<std::string> capture_names() const;

  DType dtype() const { return dtype_; }

  FluxTransformerConfig config;
  flux::FluxPosEmbed pos_embed;
  flux::CombinedTimestepTextProjEmbeddings time_text_embed;
  nn::Linear context_embedder;
  nn::Linear x_embedder;
  // The repeated blocks (regional compilation compiles one program per kind).
  std::vector<std::unique_ptr<flux::FluxTransformerBlock>> transformer_blocks;
  std::vector<std::unique_ptr<flux::FluxSingleTransformerBlock>> single_transformer_blocks;
  flux::AdaLayerNormContinuous norm_out;
  nn::Linear proj_out;

 private:
  Tensor forward_eager(const FluxTransformerInputs& inputs,
                       std::map<std::string, Tensor>* capture) const;
  DType dtype_ = DType::f32;
};

}  // namespace tessera
