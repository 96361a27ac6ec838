// SD3Transformer2DModel (diffusers/models/transformers/transformer_sd3.py) for the SD3.5-medium
// and SD3.5-large configs: patch embedding with a cropped sin-cos table, MMDiT joint blocks with
// AdaLN-zero and RMS qk-norm, the dual-attention blocks of 3.5-medium and a context_pre_only last
// block. One block class (JointTransformerBlock) covers every layer, so regional compilation
// and sequential offload see one repeated block (diffusers declares none for SD3).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/embeddings.h"
#include "nn/feed_forward.h"
#include "nn/joint_attention.h"
#include "nn/layers.h"
#include "nn/normalization.h"
#include "nn/patch_embed.h"
#include "nn/pretrained.h"

namespace tessera {

// The transformer's config.json, with diffusers' defaults for keys it may omit.
struct SD3TransformerConfig {
  int64_t sample_size = 128;
  int64_t patch_size = 2;
  int64_t in_channels = 16;
  int64_t num_layers = 18;
  int64_t attention_head_dim = 64;
  int64_t num_attention_heads = 18;
  int64_t joint_attention_dim = 4096;
  int64_t caption_projection_dim = 1152;
  int64_t pooled_projection_dim = 2048;
  int64_t out_channels = 16;  // null means in_channels
  int64_t pos_embed_max_size = 96;
  std::vector<int64_t> dual_attention_layers;  // () for SD3.0 / 3.5-large, 0..12 for 3.5-medium
  bool qk_rms_norm = false;                    // qk_norm: null or "rms_norm"

  // Shape keys are required; unsupported values are refused naming the key and the value.
  static SD3TransformerConfig from_json(const JsonConfig& config);
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  bool dual_attention(int64_t layer) const;
};

// The output pair of a block, in diffusers' order; encoder_hidden_states is undefined after the
// context_pre_only block.
struct SD3BlockOutput {
  Tensor encoder_hidden_states, hidden_states;
};

// diffusers' JointTransformerBlock (models/attention.py), every variant SD3 uses.
class JointTransformerBlock : public Module {
 public:
  JointTransformerBlock(int64_t dim, int64_t num_attention_heads, int64_t attention_head_dim,
                        bool context_pre_only, bool qk_rms_norm, bool use_dual_attention);
  // With `capture`, records "<prefix>norm1", "<prefix>norm1.{gate_msa,shift_mlp,scale_mlp,
  // gate_mlp}" (and gate_msa2, norm_hidden_states2 with dual attention), "<prefix>attn.
  // {hidden_states,encoder_hidden_states}" and "<prefix>attn2".
  SD3BlockOutput operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                            const Tensor& temb, std::map<std::string, Tensor>* capture = nullptr,
                            const std::string& prefix = "") const;
  std::vector<std::string> capture_names() const;

  bool context_pre_only, use_dual_attention;
  std::unique_ptr<nn::AdaLayerNormZero> norm1;                     // without dual attention
  std::unique_ptr<nn::SD35AdaLayerNormZeroX> norm1_x;              // "norm1" with dual attention
  std::unique_ptr<nn::AdaLayerNormZero> norm1_context;             // all but the last block
  std::unique_ptr<nn::AdaLayerNormContinuous> norm1_context_last;  // "norm1_context", last block
  nn::JointAttention attn;
  std::unique_ptr<nn::JointAttention> attn2;  // dual attention only
  nn::LayerNorm norm2;
  nn::FeedForward ff;
  std::unique_ptr<nn::LayerNorm> norm2_context;
  std::unique_ptr<nn::FeedForward> ff_context;

 private:
  std::vector<Tensor> forward_impl(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                   const Tensor& temb, bool capture) const;
};

// Named as the arguments of diffusers' SD3Transformer2DModel.forward.
struct SD3TransformerInputs {
  Tensor hidden_states;              // (B, in_channels, H, W) latents
  Tensor encoder_hidden_states;      // (B, L_txt, joint_attention_dim)
  Tensor pooled_projections;         // (B, pooled_projection_dim)
  Tensor timestep;                   // (B,), 0..1000 as the scheduler gives it (not divided)
  std::vector<int64_t> skip_layers;  // blocks to skip (skip-layer guidance)
};

class SD3Transformer2DModel : public Module {
 public:
  explicit SD3Transformer2DModel(const SD3TransformerConfig& config);
  // `tp`: split over its ranks by tp_plan(), each rank reading only its slices.
  static std::unique_ptr<SD3Transformer2DModel> from_pretrained(
      const std::string& component_folder, DType dtype, const TensorParallelConfig* tp = nullptr) {
    return load_pretrained<SD3Transformer2DModel>(component_folder, dtype, tp);
  }
  // diffusers' SD3Transformer2DModel._tp_plan: q/k/v of both streams (and of SD3.5's attn2) and
  // MLP-in column-wise; attention outputs and MLP-out row-wise. Heads stay whole on a rank.
  TensorParallelPlan tp_plan() const;
  static constexpr const char* kPretrainedName = "[SD3Transformer2DModel]";
  static SD3TransformerConfig config_from_json(const JsonConfig& c) {
    return SD3TransformerConfig::from_json(c);
  }
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }

  // Returns `sample` (B, out_channels, H, W) in the model dtype. With `capture`, records what
  // diffusers' goldens name: pos_embed, time_text_embed, context_embedder, each block's
  // internals (JointTransformerBlock) and outputs transformer_blocks.N.{encoder_,}hidden_states,
  // norm_out, proj_out. The forward and each block go through Module::call.
  Tensor forward(const SD3TransformerInputs& inputs,
                 std::map<std::string, Tensor>* capture = nullptr) const;
  std::vector<std::string> repeated_blocks() const override { return {"JointTransformerBlock"}; }
  std::vector<std::string> capture_names(const std::vector<int64_t>& skip_layers = {}) const;
  DType dtype() const { return dtype_; }

  SD3TransformerConfig config;
  nn::PatchEmbed pos_embed;
  nn::CombinedTimestepTextProjEmbeddings time_text_embed;
  nn::Linear context_embedder;
  std::vector<std::unique_ptr<JointTransformerBlock>> transformer_blocks;
  nn::AdaLayerNormContinuous norm_out;
  nn::Linear proj_out;

 private:
  Tensor forward_eager(const SD3TransformerInputs& inputs,
                       std::map<std::string, Tensor>* capture) const;
  DType dtype_ = DType::f32;
};

}  // namespace tessera
