// The language model of transformers' Mistral3ForConditionalGeneration (Mistral Small 3.x), run as
// FLUX.2's text encoder: token embeddings, decoder layers (Llama-style RMSNorm, grouped-query
// attention with rotate-half RoPE, SwiGLU MLP) under a causal mask with padding, and the final
// norm. The vision tower, projector and lm_head are not loaded. Flux2Pipeline reads the hidden
// states of layers 10, 20 and 30, so a forward may stop after the last layer a caller needs.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/layers.h"
#include "nn/pretrained.h"

namespace tessera {

// text_config of a Mistral3 config.json (or the top level of a Mistral config.json).
struct Mistral3TextConfig {
  int64_t vocab_size = 131072;
  int64_t hidden_size = 5120;
  int64_t intermediate_size = 32768;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e9;  // rope_type "default" only (no scaling)

  // Shape keys are required; unsupported values (activations, RoPE types, sliding windows) are
  // refused naming the key and the value.
  static Mistral3TextConfig from_json(const JsonConfig& config);
};

// MistralAttention: q/k/v/o projections without biases, GQA over num_key_value_heads.
class MistralAttention : public Module {
 public:
  MistralAttention(const Mistral3TextConfig& c);
  // x (B, L, D); cos/sin (L, head_dim) f32; mask (B, 1, 1, L) boolean, true = attend.
  Tensor operator()(const Tensor& x, const Tensor& cos, const Tensor& sin,
                    const Tensor& mask) const;
  int64_t heads, kv_heads, head_dim;
  nn::Linear q_proj, k_proj, v_proj, o_proj;
};

// MistralMLP: down_proj(silu(gate_proj(x)) * up_proj(x)).
class MistralMLP : public Module {
 public:
  MistralMLP(int64_t hidden, int64_t intermediate);
  Tensor operator()(const Tensor& x) const;
  nn::Linear gate_proj, up_proj, down_proj;
};

// MistralDecoderLayer, the repeated block (regional compilation, sequential offload).
class MistralDecoderLayer : public Module {
 public:
  explicit MistralDecoderLayer(const Mistral3TextConfig& c);
  // Returns the layer output; with `capture`, also input_layernorm, self_attn,
  // post_attention_layernorm and mlp (in that order after the output).
  std::vector<Tensor> operator()(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                 const Tensor& mask, bool capture = false) const;
  nn::RMSNorm input_layernorm;
  MistralAttention self_attn;
  nn::RMSNorm post_attention_layernorm;
  MistralMLP mlp;

 private:
  std::vector<Tensor> forward_impl(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                   const Tensor& mask) const;
};

// MistralModel: embed_tokens, layers, norm.
class MistralModel : public Module {
 public:
  explicit MistralModel(const Mistral3TextConfig& c);
  nn::Embedding embed_tokens;
  std::vector<std::unique_ptr<MistralDecoderLayer>> layers;
  nn::RMSNorm norm;
};

struct Mistral3TextOutput {
  // transformers' output_hidden_states: [0] the embeddings, [i] the output of layer i - 1;
  // when every layer ran, the last entry is after the final norm (as transformers returns it).
  std::vector<Tensor> hidden_states;
};

class Mistral3TextModel : public Module {
 public:
  explicit Mistral3TextModel(const Mistral3TextConfig& config);
  // `tp`: split over its ranks by tp_plan(), each rank reading only its slices.
  static std::unique_ptr<Mistral3TextModel> from_pretrained(
      const std::string& component_folder, DType dtype, const TensorParallelConfig* tp = nullptr) {
    return load_pretrained<Mistral3TextModel>(component_folder, dtype, tp);
  }
  // transformers' MistralModel.base_model_tp_plan: q/k/v_proj and the MLP's gate/up_proj
  // column-wise, o_proj and down_proj row-wise (an all-reduce each). Grouped-query attention
  // keeps whole query and key/value heads on a rank, so num_attention_heads and
  // num_key_value_heads must both divide; embeddings and norms stay replicated.
  TensorParallelPlan tp_plan() const;
  // For load_pretrained (nn/pretrained.h): checkpoints name the language model
  // "language_model.model.*" (older transformers) or "model.language_model.*".
  static constexpr const char* kPretrainedName = "[Mistral3ForConditionalGeneration]";
  static Mistral3TextConfig config_from_json(const JsonConfig& c) {
    return Mistral3TextConfig::from_json(c);
  }
  static std::unique_ptr<WeightSource> weight_source(const CheckpointWeightSource& checkpoint);
  // The vision tower, the projector and lm_head: not part of the text encoder.
  static bool ignored_tensor(const std::string& name);
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }

  // input_ids (B, L) integers; attention_mask (B, L) (nonzero = attend) or undefined. Runs the
  // first `num_layers` layers (all when negative; the final norm only then). With `capture`,
  // records model.language_model.{embed_tokens, layers.N[.input_layernorm|.self_attn|
  // .post_attention_layernorm|.mlp], norm}. Positions are arange(L) whatever the mask.
  Mistral3TextOutput forward(const Tensor& input_ids, const Tensor& attention_mask,
                             int64_t num_layers = -1,
                             std::map<std::string, Tensor>* capture = nullptr) const;
  std::vector<std::string> repeated_blocks() const override { return {"MistralDecoderLayer"}; }
  // Flux2Pipeline's prompt embeddings: stack(hidden_states[k] for k in layers, 1), permuted to
  // (B, L, len(layers) * hidden_size). Runs only the layers that needs.
  Tensor prompt_embeds(const Tensor& input_ids, const Tensor& attention_mask,
                       const std::vector<int64_t>& layers) const;
  // The rotary tables of positions 0..L-1 (f32 (L, head_dim)), as transformers computes them.
  std::pair<Tensor, Tensor> rotary_tables(int64_t length) const;

  // The names forward's `capture` fills when `run` layers run, in a fixed order.
  std::vector<std::string> capture_names(int64_t run) const;

  const Mistral3TextConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

  MistralModel language_model;  // "model.language_model"

 private:
  Mistral3TextOutput forward_eager(const Tensor& input_ids, const Tensor& attention_mask,
                                   int64_t run, std::map<std::string, Tensor>* capture) const;
  Mistral3TextConfig config_;
  DType dtype_ = DType::f32;
};

}  // namespace tessera
