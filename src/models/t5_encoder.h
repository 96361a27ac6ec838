// transformers' T5EncoderModel (models/t5/modeling_t5.py): the T5 v1.1 encoder of FLUX.1 and
// SD3 (gated-GELU feed-forward) and original T5 (ReLU). Relative position bias computed by the
// first block and shared by all, unscaled attention, RMS-style T5LayerNorm.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/layers.h"
#include "nn/pretrained.h"

namespace tessera {

// The keys of a T5Config config.json that tessera reads. Shape keys are required; the rest take
// transformers' defaults.
struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  std::string feed_forward_proj = "relu";  // "relu" (T5) or "gated-gelu" (T5 v1.1)

  // Unsupported values are refused naming the key and the value.
  static T5Config from_json(const JsonConfig& config);
  bool is_gated_act() const { return feed_forward_proj == "gated-gelu"; }
  int64_t inner_dim() const { return num_heads * d_kv; }
};

// T5Attention._relative_position_bucket over memory_position - query_position for every
// (query, key) pair: an (Lq, Lk) i64 table. Depends only on the lengths, like position ids;
// computed with the fp32 arithmetic torch uses (log, divide, multiply, truncate); checked equal
// to transformers for |rel| < 4100 at (32, 128), (64, 256), (128, 512), (16, 64), (32, 64).
Tensor t5_relative_position_buckets(int64_t query_length, int64_t key_length, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance);

// transformers' NewGELUActivation ("gelu_new"), op for op so bf16 rounds where torch rounds:
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).
Tensor gelu_new(const Tensor& x);

// The fields of transformers' BaseModelOutput.
struct T5EncoderOutput {
  Tensor last_hidden_state;  // (B, L, d_model), after encoder.final_layer_norm
  // With output_hidden_states: the embeddings, then every block's output, the last one replaced
  // by last_hidden_state (as transformers' capture_outputs does for T5).
  std::vector<Tensor> hidden_states;
};

struct T5EncoderForwardOptions {
  bool output_hidden_states = false;
  // Optional (B, L) padding mask, nonzero = attend. diffusers' FLUX.1 and SD3 pipelines pass none.
  Tensor attention_mask;
};

namespace t5 {

class T5Attention : public Module {
 public:
  T5Attention(const T5Config& c, bool has_relative_attention_bias);
  // position_bias (1, H, Lq, Lk) from compute_bias, or with padding folded in (B, H, Lq, Lk).
  Tensor forward(const Tensor& x, const Tensor& position_bias) const;
  // (1, H, Lq, Lk) in the weight dtype; only the first block has the table.
  Tensor compute_bias(int64_t query_length, int64_t key_length) const;
  int64_t n_heads, d_kv, num_buckets, max_distance;
  bool has_relative_attention_bias;
  nn::Linear q, k, v, o;
  // "relative_attention_bias" (num_buckets, n_heads), an nn.Embedding as in transformers; null
  // past the first block. Under tensor parallelism it holds this rank's heads' columns.
  std::unique_ptr<nn::Embedding> relative_attention_bias;
};

class T5LayerSelfAttention : public Module {
 public:
  T5LayerSelfAttention(const T5Config& c, bool has_relative_attention_bias);
  Tensor forward(const Tensor& x, const Tensor& position_bias) const;
  T5Attention SelfAttention;
  nn::RMSNorm layer_norm;
};

// T5DenseGatedActDense (wi_0, wi_1, wo) or T5DenseActDense (wi, wo).
class T5DenseReluDense : public Module {
 public:
  explicit T5DenseReluDense(const T5Config& c);
  Tensor forward(const Tensor& x) const;
  bool gated;
  std::unique_ptr<nn::Linear> wi, wi_0, wi_1;
  nn::Linear wo;
};

class T5LayerFF : public Module {
 public:
  explicit T5LayerFF(const T5Config& c);
  Tensor forward(const Tensor& x) const;
  T5DenseReluDense DenseReluDense;
  nn::RMSNorm layer_norm;
};

class T5Block : public Module {
 public:
  T5Block(const T5Config& c, bool has_relative_attention_bias);
  T5LayerSelfAttention self_attention;  // "layer.0"
  T5LayerFF ff;                         // "layer.1"
};

}  // namespace t5

class T5EncoderModel : public Module {
 public:
  explicit T5EncoderModel(const T5Config& config);
  // Reads <folder>/config.json and loads the checkpoint converted to `dtype` (f32 or bf16). The
  // token table is "shared.weight" or, failing that, "encoder.embed_tokens.weight" (tied).
  // `tp`: split over its ranks by tp_plan(), each rank reading only its slices.
  static std::unique_ptr<T5EncoderModel> from_pretrained(const std::string& component_folder,
                                                         DType dtype,
                                                         const TensorParallelConfig* tp = nullptr) {
    return load_pretrained<T5EncoderModel>(component_folder, dtype, tp);
  }
  // The Megatron split of every encoder block, in the shape of transformers' base_model_tp_plan
  // (which writes none for T5): q/k/v and the feed-forward's wi (wi_0, wi_1) column-wise, o and
  // wo row-wise (an all-reduce each), the first block's relative-attention bias table split by
  // heads (its columns). Embeddings and norms stay replicated; num_heads must divide.
  TensorParallelPlan tp_plan() const;
  // For load_pretrained (nn/pretrained.h).
  static constexpr const char* kPretrainedName = "[T5EncoderModel]";
  static T5Config config_from_json(const JsonConfig& c) { return T5Config::from_json(c); }
  static bool ignored_tensor(const std::string& name);
  void loaded(const WeightSource& source, DType dtype);
  // input_ids (B, L) i64. With `capture`, records the activations the goldens name:
  // encoder.embed_tokens, encoder.block.N(.position_bias), encoder.block.N.layer.0
  // (.position_bias), encoder.final_layer_norm.
  // Without `capture` the forward goes through Module::call (ids and mask in, outputs out).
  T5EncoderOutput forward(const Tensor& input_ids, std::map<std::string, Tensor>* capture = nullptr,
                          const T5EncoderForwardOptions& options = {}) const;
  DType dtype() const { return dtype_; }

  T5Config config;
  Tensor shared;        // "shared.weight" (vocab_size, d_model)
  Tensor embed_tokens;  // "encoder.embed_tokens.weight", used only when shared is absent
  std::vector<std::unique_ptr<t5::T5Block>> block;  // "encoder.block.N"
  nn::RMSNorm final_layer_norm;                     // "encoder.final_layer_norm"

 private:
  T5EncoderOutput forward_eager(const Tensor& input_ids, std::map<std::string, Tensor>* capture,
                                const T5EncoderForwardOptions& options) const;

  DType dtype_ = DType::f32;
};

}  // namespace tessera
