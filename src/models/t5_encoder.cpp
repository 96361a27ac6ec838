#include "models/t5_encoder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "nn/checkpoint_source.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "[T5EncoderModel]";

void require_positive(const JsonConfig& c, const char* key, int64_t v) {
  TESSERA_CHECK(v > 0, kWhere, " unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

}  // namespace

T5Config T5Config::from_json(const JsonConfig& c) {
  const std::string model_type = c.get_string("model_type", "t5");
  TESSERA_CHECK(model_type == "t5", kWhere, " unsupported value model_type='", model_type, "' in ",
                c.source(), "; expected t5");
  T5Config cfg;
  cfg.vocab_size = c.get_int("vocab_size");
  cfg.d_model = c.get_int("d_model");
  cfg.d_kv = c.get_int("d_kv");
  cfg.d_ff = c.get_int("d_ff");
  cfg.num_layers = c.get_int("num_layers");
  cfg.num_heads = c.get_int("num_heads");
  cfg.relative_attention_num_buckets =
      c.get_int("relative_attention_num_buckets", cfg.relative_attention_num_buckets);
  cfg.relative_attention_max_distance =
      c.get_int("relative_attention_max_distance", cfg.relative_attention_max_distance);
  cfg.layer_norm_epsilon = c.get_float("layer_norm_epsilon", cfg.layer_norm_epsilon);
  cfg.feed_forward_proj = c.get_string("feed_forward_proj", cfg.feed_forward_proj);

  require_positive(c, "vocab_size", cfg.vocab_size);
  require_positive(c, "d_model", cfg.d_model);
  require_positive(c, "d_kv", cfg.d_kv);
  require_positive(c, "d_ff", cfg.d_ff);
  require_positive(c, "num_layers", cfg.num_layers);
  require_positive(c, "num_heads", cfg.num_heads);
  // Bidirectional buckets: half per direction, half of those exact, so at least 4.
  TESSERA_CHECK(cfg.relative_attention_num_buckets >= 4, kWhere,
                " unsupported value relative_attention_num_buckets=",
                cfg.relative_attention_num_buckets, " in ", c.source(), "; expected at least 4");
  TESSERA_CHECK(
      cfg.relative_attention_max_distance > cfg.relative_attention_num_buckets / 4, kWhere,
      " unsupported value relative_attention_max_distance=", cfg.relative_attention_max_distance,
      " in ", c.source(), "; expected more than relative_attention_num_buckets / 4");
  TESSERA_CHECK(cfg.feed_forward_proj == "gated-gelu" || cfg.feed_forward_proj == "relu", kWhere,
                " unsupported value feed_forward_proj='", cfg.feed_forward_proj, "' in ",
                c.source(), "; expected gated-gelu or relu");
  return cfg;
}

Tensor t5_relative_position_buckets(int64_t query_length, int64_t key_length, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance) {
  int64_t n = num_buckets;
  if (bidirectional) n /= 2;
  const int64_t max_exact = n / 2;
  // torch: log(rel.float() / max_exact) / math.log(max_distance / max_exact) * (n - max_exact),
  // each step one fp32 op with the Python scalar rounded to fp32, then .to(long) truncates.
  const float log_ratio = float(std::log(double(max_distance) / double(max_exact)));
  const float span = float(n - max_exact);
  std::vector<int64_t> table(size_t(query_length * key_length));
  for (int64_t i = 0; i < query_length; ++i) {
    for (int64_t j = 0; j < key_length; ++j) {
      int64_t rel = j - i;  // memory_position - context_position
      int64_t bucket = 0;
      if (bidirectional) {
        if (rel > 0) bucket += n;
        rel = rel < 0 ? -rel : rel;
      } else {
        rel = rel < 0 ? -rel : 0;
      }
      if (rel < max_exact) {
        bucket += rel;
      } else {
        const float scaled = std::log(float(rel) / float(max_exact)) / log_ratio * span;
        bucket += std::min<int64_t>(max_exact + int64_t(scaled), n - 1);
      }
      table[size_t(i * key_length + j)] = bucket;
    }
  }
  return Tensor::from_ints(table, {query_length, key_length});
}

Tensor gelu_new(const Tensor& x) {
  const Tensor inner = x + 0.044715 * pow(x, 3.0);
  return (0.5 * x) * (1.0 + tanh(std::sqrt(2.0 / M_PI) * inner));
}

namespace t5 {

T5Attention::T5Attention(const T5Config& c, bool has_bias)
    : n_heads(c.num_heads),
      d_kv(c.d_kv),
      num_buckets(c.relative_attention_num_buckets),
      max_distance(c.relative_attention_max_distance),
      has_relative_attention_bias(has_bias),
      q(c.d_model, c.inner_dim(), false),
      k(c.d_model, c.inner_dim(), false),
      v(c.d_model, c.inner_dim(), false),
      o(c.inner_dim(), c.d_model, false) {
  register_module("q", &q);
  register_module("k", &k);
  register_module("v", &v);
  register_module("o", &o);
  if (has_bias) {
    relative_attention_bias = std::make_unique<nn::Embedding>(num_buckets, n_heads);
    register_module("relative_attention_bias", relative_attention_bias.get());
  }
}

Tensor T5Attention::compute_bias(int64_t query_length, int64_t key_length) const {
  const Tensor buckets =
      t5_relative_position_buckets(query_length, key_length, true, num_buckets, max_distance);
  const Tensor& table = relative_attention_bias->weight;
  return embedding(table, buckets.to(table.device())).permute({2, 0, 1}).unsqueeze(0);
}

Tensor T5Attention::forward(const Tensor& x, const Tensor& position_bias) const {
  const int64_t B = x.dim(0), L = x.dim(1);
  // -1 heads: a tensor-parallel rank's q/k/v hold only its heads (whole ones, d_kv each).
  auto heads = [&](const Tensor& t) { return t.view({B, L, -1, d_kv}).transpose(1, 2); };
  SdpaOptions opt;
  opt.scale = 1.0;  // T5 does not scale the scores
  opt.mask = position_bias;
  const Tensor out = scaled_dot_product_attention(heads(q(x)), heads(k(x)), heads(v(x)), opt);
  return o(contiguous(out.transpose(1, 2)).flatten(2, 3));
}

T5LayerSelfAttention::T5LayerSelfAttention(const T5Config& c, bool has_bias)
    : SelfAttention(c, has_bias), layer_norm(c.d_model, c.layer_norm_epsilon) {
  register_module("SelfAttention", &SelfAttention);
  register_module("layer_norm", &layer_norm);
}

Tensor T5LayerSelfAttention::forward(const Tensor& x, const Tensor& position_bias) const {
  return x + SelfAttention.forward(layer_norm(x), position_bias);
}

T5DenseReluDense::T5DenseReluDense(const T5Config& c)
    : gated(c.is_gated_act()), wo(c.d_ff, c.d_model, false) {
  if (gated) {
    wi_0 = std::make_unique<nn::Linear>(c.d_model, c.d_ff, false);
    wi_1 = std::make_unique<nn::Linear>(c.d_model, c.d_ff, false);
    register_module("wi_0", wi_0.get());
    register_module("wi_1", wi_1.get());
  } else {
    wi = std::make_unique<nn::Linear>(c.d_model, c.d_ff, false);
    register_module("wi", wi.get());
  }
  register_module("wo", &wo);
}

Tensor T5DenseReluDense::forward(const Tensor& x) const {
  // transformers casts to wo's dtype first; wo is kept in fp32 only for f16 models
  // (_keep_in_fp32_modules), so in f32 and bf16 the cast is a no-op.
  if (gated) return wo(gelu_new((*wi_0)(x)) * (*wi_1)(x));
  return wo(relu((*wi)(x)));
}

T5LayerFF::T5LayerFF(const T5Config& c)
    : DenseReluDense(c), layer_norm(c.d_model, c.layer_norm_epsilon) {
  register_module("DenseReluDense", &DenseReluDense);
  register_module("layer_norm", &layer_norm);
}

Tensor T5LayerFF::forward(const Tensor& x) const {
  return x + DenseReluDense.forward(layer_norm(x));
}

T5Block::T5Block(const T5Config& c, bool has_bias) : self_attention(c, has_bias), ff(c) {
  register_module("layer.0", &self_attention);
  register_module("layer.1", &ff);
}

}  // namespace t5

T5EncoderModel::T5EncoderModel(const T5Config& c)
    : config(c), final_layer_norm(c.d_model, c.layer_norm_epsilon) {
  register_parameter("shared.weight", &shared, {c.vocab_size, c.d_model}, /*optional=*/true);
  register_parameter("encoder.embed_tokens.weight", &embed_tokens, {c.vocab_size, c.d_model},
                     /*optional=*/true);
  for (int64_t i = 0; i < c.num_layers; ++i)
    block.push_back(std::make_unique<t5::T5Block>(c, /*has_relative_attention_bias=*/i == 0));
  register_modules("encoder.block", block);
  register_module("encoder.final_layer_norm", &final_layer_norm);
}

TensorParallelPlan T5EncoderModel::tp_plan() const {
  TensorParallelPlan plan;
  const auto col = ParallelStyle::colwise, row = ParallelStyle::rowwise;
  const std::string attn = "encoder.block.*.layer.0.SelfAttention.";
  for (const char* name : {"q", "k", "v", "relative_attention_bias"})
    plan.entries.push_back({attn + name, col, {}});
  plan.entries.push_back({attn + "o", row, {}});
  const std::string ff = "encoder.block.*.layer.1.DenseReluDense.";
  for (const char* name : {"wi", "wi_0", "wi_1"}) plan.entries.push_back({ff + name, col, {}});
  plan.entries.push_back({ff + "wo", row, {}});
  plan.divisible = {{"num_heads", config.num_heads}};
  return plan;
}

bool T5EncoderModel::ignored_tensor(const std::string& name) {
  // A full T5 checkpoint's decoder, which T5EncoderModel ignores as transformers does.
  return name.rfind("decoder.", 0) == 0 || name.rfind("lm_head.", 0) == 0;
}

void T5EncoderModel::loaded(const WeightSource& source, DType dtype) {
  TESSERA_CHECK(shared.defined() || embed_tokens.defined(), kWhere, " ", source.describe(),
                ": missing tensor 'shared.weight' (or its tied copy ",
                "'encoder.embed_tokens.weight'), expected shape ",
                shape_str({config.vocab_size, config.d_model}));
  // The two names are one tied table; keep a single copy.
  if (shared.defined()) embed_tokens = Tensor();
  dtype_ = dtype;
}

T5EncoderOutput T5EncoderModel::forward(const Tensor& input_ids,
                                        std::map<std::string, Tensor>* capture,
                                        const T5EncoderForwardOptions& options) const {
  if (capture) return forward_eager(input_ids, capture, options);  // activations need eager
  // ids and the optional mask are call()'s inputs; hidden_states extra outputs.
  const auto outs = call(
      {input_ids, options.attention_mask},
      [&](const std::vector<Tensor>& x) {
        T5EncoderForwardOptions o = options;
        o.attention_mask = x[1];
        T5EncoderOutput r = forward_eager(x[0], nullptr, o);
        std::vector<Tensor> v{r.last_hidden_state};
        v.insert(v.end(), r.hidden_states.begin(), r.hidden_states.end());
        return v;
      },
      options.output_hidden_states ? 1 : 0);
  T5EncoderOutput r;
  r.last_hidden_state = outs[0];
  r.hidden_states.assign(outs.begin() + 1, outs.end());
  return r;
}

T5EncoderOutput T5EncoderModel::forward_eager(const Tensor& input_ids,
                                              std::map<std::string, Tensor>* capture,
                                              const T5EncoderForwardOptions& options) const {
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[name] = t;
  };
  TESSERA_CHECK(input_ids.defined() && input_ids.ndim() == 2 &&
                    (input_ids.dtype() == DType::i64 || input_ids.dtype() == DType::i32),
                kWhere, " input_ids must be (B, L) i64, got ",
                input_ids.defined() ? input_ids.describe() : "nothing");
  const int64_t B = input_ids.dim(0), L = input_ids.dim(1);
  TESSERA_CHECK(L >= 1, kWhere, " input_ids has an empty sequence");

  T5EncoderOutput out;
  Tensor hidden = embedding(shared.defined() ? shared : embed_tokens, input_ids);
  record("encoder.embed_tokens", hidden);
  if (options.output_hidden_states) out.hidden_states.push_back(hidden);

  // Computed once by the first block and passed on to the others; contiguous once for all.
  const Tensor position_bias =
      contiguous(block[0]->self_attention.SelfAttention.compute_bias(L, L));
  Tensor attention_bias = position_bias;
  if (options.attention_mask.defined()) {
    const Tensor& m = options.attention_mask;
    TESSERA_CHECK(m.shape() == Shape({B, L}), kWhere, " attention_mask must be (", B, ", ", L,
                  ") like input_ids, got ", m.describe());
    // transformers' sdpa path: where(mask, position_bias, finfo(dtype).min).
    const DType dt = position_bias.dtype();
    const float lowest =
        dt == DType::bf16 ? bf16_to_f32(0xff7f) : std::numeric_limits<float>::lowest();
    attention_bias =
        where(m.view({B, 1, 1, L}), position_bias,
              Tensor::from_floats({lowest}, {1}, dt).to(position_bias.device()));
  }

  for (size_t i = 0; i < block.size(); ++i) {
    const std::string name = "encoder.block." + std::to_string(i);
    const Tensor attended = block[i]->self_attention.forward(hidden, attention_bias);
    record(name + ".layer.0", attended);
    record(name + ".layer.0.position_bias", position_bias);
    hidden = block[i]->ff.forward(attended);
    record(name, hidden);
    record(name + ".position_bias", position_bias);
    if (options.output_hidden_states) out.hidden_states.push_back(hidden);
  }
  out.last_hidden_state = final_layer_norm(hidden);
  record("encoder.final_layer_norm", out.last_hidden_state);
  if (options.output_hidden_states) out.hidden_states.back() = out.last_hidden_state;
  return out;
}

}  // namespace tessera
