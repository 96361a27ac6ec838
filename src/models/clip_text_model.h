// transformers' CLIPTextModel and CLIPTextModelWithProjection (models/clip/modeling_clip.py): the
// text towers of CLIP-L (FLUX.1, SD3) and CLIP-G (SD3), pre-LN encoder layers with causal
// self-attention, pooled at the end-of-text token.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/layers.h"
#include "nn/pretrained.h"

namespace tessera {

// The keys of a CLIPTextConfig config.json that tessera reads. Shape keys are required; the rest
// take transformers' defaults.
struct CLIPTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  int64_t projection_dim = 512;           // CLIPTextModelWithProjection only
  std::string hidden_act = "quick_gelu";  // quick_gelu (CLIP-L), gelu (CLIP-G), gelu_new, ...
  double layer_norm_eps = 1e-5;
  int64_t eos_token_id = 49407;  // 2 selects the legacy pooling at argmax(input_ids)

  // Unsupported values are refused naming the key and the value. `with_projection` also reads
  // projection_dim.
  static CLIPTextConfig from_json(const JsonConfig& config, bool with_projection);
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// The fields of transformers' BaseModelOutputWithPooling / CLIPTextModelOutput.
struct CLIPTextOutput {
  Tensor last_hidden_state;  // (B, L, hidden), after final_layer_norm
  Tensor pooler_output;      // (B, hidden): last_hidden_state at the end-of-text token of each row
  Tensor text_embeds;        // (B, projection_dim): text_projection(pooler_output); WithProjection
  // With output_hidden_states: the embeddings, then every layer's output (the last one before
  // final_layer_norm, as transformers); SD3 reads hidden_states[-2].
  std::vector<Tensor> hidden_states;
};

struct CLIPTextForwardOptions {
  bool output_hidden_states = false;
  // Optional (B, L) padding mask, nonzero = attend; combined with the causal mask. diffusers'
  // FLUX.1 and SD3 pipelines pass none.
  Tensor attention_mask;
};

namespace clip {

class CLIPTextEmbeddings : public Module {
 public:
  explicit CLIPTextEmbeddings(const CLIPTextConfig& c);
  Tensor forward(const Tensor& input_ids) const;  // token + position embeddings
  nn::Embedding token_embedding, position_embedding;
};

class CLIPAttention : public Module {
 public:
  explicit CLIPAttention(const CLIPTextConfig& c);
  Tensor forward(const Tensor& x, const Tensor& padding_mask) const;
  int64_t num_heads, head_dim;
  nn::Linear q_proj, k_proj, v_proj, out_proj;
};

class CLIPMLP : public Module {
 public:
  explicit CLIPMLP(const CLIPTextConfig& c);
  Tensor forward(const Tensor& x) const;
  std::string activation;
  nn::Linear fc1, fc2;
};

class CLIPEncoderLayer : public Module {
 public:
  explicit CLIPEncoderLayer(const CLIPTextConfig& c);
  Tensor forward(const Tensor& x, const Tensor& padding_mask) const;
  CLIPAttention self_attn;
  nn::LayerNorm layer_norm1;
  CLIPMLP mlp;
  nn::LayerNorm layer_norm2;
};

// The module transformers 4 calls CLIPTextTransformer (`text_model.` in published checkpoints).
class CLIPTextTransformer : public Module {
 public:
  explicit CLIPTextTransformer(const CLIPTextConfig& c);
  // Fills last_hidden_state, pooler_output and (when asked) hidden_states. Records
  // "<prefix>embeddings", "<prefix>encoder.layers.N" and "<prefix>final_layer_norm".
  CLIPTextOutput forward(const Tensor& input_ids, const CLIPTextForwardOptions& options,
                         std::map<std::string, Tensor>* capture, const std::string& prefix) const;
  CLIPTextConfig config;
  CLIPTextEmbeddings embeddings;
  std::vector<std::unique_ptr<CLIPEncoderLayer>> layers;  // "encoder.layers.N"
  nn::LayerNorm final_layer_norm;
};

}  // namespace clip

// For load_pretrained (nn/pretrained.h): transformers 5 saves the weights without the
// `text_model.` prefix that published checkpoints use; both load.
std::unique_ptr<WeightSource> clip_weight_source(const CheckpointWeightSource& checkpoint);
bool clip_ignored_tensor(const std::string& name);

class CLIPTextModel : public Module {
 public:
  explicit CLIPTextModel(const CLIPTextConfig& config);
  // Reads <folder>/config.json and loads the checkpoint converted to `dtype` (f32 or bf16).
  // Weights may be named with or without the `text_model.` prefix.
  static std::unique_ptr<CLIPTextModel> from_pretrained(const std::string& component_folder,
                                                        DType dtype) {
    return load_pretrained<CLIPTextModel>(component_folder, dtype);
  }
  static constexpr const char* kPretrainedName = "[CLIPTextModel]";
  static CLIPTextConfig config_from_json(const JsonConfig& c) {
    return CLIPTextConfig::from_json(c, false);
  }
  static std::unique_ptr<WeightSource> weight_source(const CheckpointWeightSource& checkpoint) {
    return clip_weight_source(checkpoint);
  }
  static bool ignored_tensor(const std::string& name) { return clip_ignored_tensor(name); }
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }
  // input_ids (B, L) i64 with L <= max_position_embeddings. With `capture`, records the
  // activations the goldens name: text_model.embeddings, text_model.encoder.layers.N,
  // text_model.final_layer_norm.
  CLIPTextOutput forward(const Tensor& input_ids, std::map<std::string, Tensor>* capture = nullptr,
                         const CLIPTextForwardOptions& options = {}) const;
  const CLIPTextConfig& config() const { return text_model.config; }
  DType dtype() const { return dtype_; }

  clip::CLIPTextTransformer text_model;

 private:
  DType dtype_ = DType::f32;
};

class CLIPTextModelWithProjection : public Module {
 public:
  explicit CLIPTextModelWithProjection(const CLIPTextConfig& config);
  static std::unique_ptr<CLIPTextModelWithProjection> from_pretrained(
      const std::string& component_folder, DType dtype) {
    return load_pretrained<CLIPTextModelWithProjection>(component_folder, dtype);
  }
  static constexpr const char* kPretrainedName = "[CLIPTextModelWithProjection]";
  static CLIPTextConfig config_from_json(const JsonConfig& c) {
    return CLIPTextConfig::from_json(c, true);
  }
  static std::unique_ptr<WeightSource> weight_source(const CheckpointWeightSource& checkpoint) {
    return clip_weight_source(checkpoint);
  }
  static bool ignored_tensor(const std::string& name) { return clip_ignored_tensor(name); }
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }
  // As CLIPTextModel::forward, plus text_embeds (recorded as "text_projection").
  CLIPTextOutput forward(const Tensor& input_ids, std::map<std::string, Tensor>* capture = nullptr,
                         const CLIPTextForwardOptions& options = {}) const;
  const CLIPTextConfig& config() const { return text_model.config; }
  DType dtype() const { return dtype_; }

  clip::CLIPTextTransformer text_model;
  nn::Linear text_projection;  // no bias

 private:
  DType dtype_ = DType::f32;
};

}  // namespace tessera
