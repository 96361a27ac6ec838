#include "models/mistral3_text_model.h"

#include <algorithm>
#include <cmath>

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "[Mistral3ForConditionalGeneration]";

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

// transformers' names for the language model and the checkpoint's older ones.
constexpr const char* kModelPrefix = "model.language_model.";
constexpr const char* kOldPrefix = "language_model.model.";

void require_positive(const JsonConfig& c, const std::string& key, int64_t v) {
  TESSERA_CHECK(v > 0, kWhere, " unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

}  // namespace

Mistral3TextConfig Mistral3TextConfig::from_json(const JsonConfig& root) {
  // Mistral3ForConditionalGeneration nests the language model's keys under text_config.
  const JsonConfig c = root.has("text_config") ? root.get_object("text_config") : root;
  Mistral3TextConfig cfg;
  cfg.vocab_size = c.get_int("vocab_size");
  cfg.hidden_size = c.get_int("hidden_size");
  cfg.intermediate_size = c.get_int("intermediate_size");
  cfg.num_hidden_layers = c.get_int("num_hidden_layers");
  cfg.num_attention_heads = c.get_int("num_attention_heads");
  cfg.num_key_value_heads = c.get_int("num_key_value_heads", cfg.num_attention_heads);
  require_positive(c, "vocab_size", cfg.vocab_size);
  require_positive(c, "hidden_size", cfg.hidden_size);
  require_positive(c, "intermediate_size", cfg.intermediate_size);
  require_positive(c, "num_hidden_layers", cfg.num_hidden_layers);
  require_positive(c, "num_attention_heads", cfg.num_attention_heads);
  require_positive(c, "num_key_value_heads", cfg.num_key_value_heads);
  cfg.head_dim = c.get_int("head_dim", cfg.hidden_size / cfg.num_attention_heads);
  require_positive(c, "head_dim", cfg.head_dim);
  TESSERA_CHECK(cfg.head_dim % 2 == 0, kWhere, " unsupported value head_dim=", cfg.head_dim, " in ",
                c.source(), "; RoPE needs an even head_dim");
  TESSERA_CHECK(cfg.num_attention_heads % cfg.num_key_value_heads == 0, kWhere,
                " unsupported value num_key_value_heads=", cfg.num_key_value_heads, " in ",
                c.source(), "; it must divide num_attention_heads=", cfg.num_attention_heads);
  cfg.rms_norm_eps = c.get_float("rms_norm_eps", 1e-6);
  const std::string act = c.get_string("hidden_act", "silu");
  TESSERA_CHECK(act == "silu", kWhere, " unsupported value hidden_act='", act, "' in ", c.source(),
                "; expected silu");
  TESSERA_CHECK(!c.has("sliding_window"), kWhere,
                " unsupported value sliding_window=", c.raw().at("sliding_window").dump(), " in ",
                c.source(), "; only full causal attention (null) is implemented");
  // transformers 5 writes rope_parameters; older configs rope_theta and rope_scaling.
  std::string rope_type = "default";
  if (c.has("rope_parameters")) {
    const JsonConfig r = c.get_object("rope_parameters");
    cfg.rope_theta = r.get_float("rope_theta");
    rope_type = r.get_string("rope_type", "default");
  } else {
    cfg.rope_theta = c.get_float("rope_theta", 10000.0);
    if (c.has("rope_scaling")) {
      const JsonConfig r = c.get_object("rope_scaling");
      rope_type = r.get_string("rope_type", r.get_string("type", "default"));
    }
  }
  TESSERA_CHECK(rope_type == "default", kWhere, " unsupported value rope_type='", rope_type,
                "' in ", c.source(), "; only the default RoPE (no scaling) is implemented");
  TESSERA_CHECK(cfg.rope_theta > 0, kWhere, " unsupported value rope_theta=", cfg.rope_theta,
                " in ", c.source());
  return cfg;
}

MistralAttention::MistralAttention(const Mistral3TextConfig& c)
    : heads(c.num_attention_heads),
      kv_heads(c.num_key_value_heads),
      head_dim(c.head_dim),
      q_proj(c.hidden_size, c.num_attention_heads * c.head_dim, false),
      k_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, false),
      v_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, false),
      o_proj(c.num_attention_heads * c.head_dim, c.hidden_size, false) {
  register_module("q_proj", &q_proj);
  register_module("k_proj", &k_proj);
  register_module("v_proj", &v_proj);
  register_module("o_proj", &o_proj);
}

Tensor MistralAttention::operator()(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                    const Tensor& mask) const {
  const int64_t B = x.dim(0), L = x.dim(1);
  // (B, H, L, D) views, as transformers transposes them.
  auto heads_of = [&](const Tensor& t) { return t.view({B, L, -1, head_dim}).transpose(1, 2); };
  // transformers rotates in the activation dtype (cos/sin cast to it, each product rounded).
  const Tensor q =
      apply_rope(heads_of(q_proj(x)), cos, sin, RopeLayout::split_halves, 2, RopeMath::input_dtype);
  const Tensor k =
      apply_rope(heads_of(k_proj(x)), cos, sin, RopeLayout::split_halves, 2, RopeMath::input_dtype);
  const Tensor v = heads_of(v_proj(x));
  SdpaOptions opt;
  opt.causal = true;
  opt.mask = mask;  // padding; a query with no visible key gets 0, as torch
  Tensor out = scaled_dot_product_attention(q, k, v, opt);
  // This rank's heads only under tensor parallelism (o_proj then all-reduces).
  return o_proj(contiguous(out.transpose(1, 2)).flatten(2, 3));
}

MistralMLP::MistralMLP(int64_t hidden, int64_t intermediate)
    : gate_proj(hidden, intermediate, false),
      up_proj(hidden, intermediate, false),
      down_proj(intermediate, hidden, false) {
  register_module("gate_proj", &gate_proj);
  register_module("up_proj", &up_proj);
  register_module("down_proj", &down_proj);
}

Tensor MistralMLP::operator()(const Tensor& x) const {
  return down_proj(silu(gate_proj(x)) * up_proj(x));
}

MistralDecoderLayer::MistralDecoderLayer(const Mistral3TextConfig& c)
    : input_layernorm(c.hidden_size, c.rms_norm_eps, true, RmsNormStyle::llama),
      self_attn(c),
      post_attention_layernorm(c.hidden_size, c.rms_norm_eps, true, RmsNormStyle::llama),
      mlp(c.hidden_size, c.intermediate_size) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
}

std::vector<Tensor> MistralDecoderLayer::operator()(const Tensor& x, const Tensor& cos,
                                                    const Tensor& sin, const Tensor& mask,
                                                    bool capture) const {
  return call(
      {x, cos, sin, mask},
      [this, capture](const std::vector<Tensor>& in) {
        std::vector<Tensor> r = forward_impl(in[0], in[1], in[2], in[3]);
        if (!capture) r.resize(1);
        return r;
      },
      capture ? 1 : 0);
}

std::vector<Tensor> MistralDecoderLayer::forward_impl(const Tensor& x, const Tensor& cos,
                                                      const Tensor& sin, const Tensor& mask) const {
  const Tensor normed = input_layernorm(x);
  const Tensor attn = self_attn(normed, cos, sin, mask);
  const Tensor h = x + attn;
  const Tensor post = post_attention_layernorm(h);
  const Tensor ff = mlp(post);
  return {h + ff, normed, attn, post, ff};
}

MistralModel::MistralModel(const Mistral3TextConfig& c)
    : embed_tokens(c.vocab_size, c.hidden_size),
      norm(c.hidden_size, c.rms_norm_eps, true, RmsNormStyle::llama) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(std::make_unique<MistralDecoderLayer>(c));
  register_module("embed_tokens", &embed_tokens);
  register_modules("layers", layers);
  register_module("norm", &norm);
}

Mistral3TextModel::Mistral3TextModel(const Mistral3TextConfig& c) : language_model(c), config_(c) {
  register_module("model.language_model", &language_model);
}

std::unique_ptr<WeightSource> Mistral3TextModel::weight_source(
    const CheckpointWeightSource& checkpoint) {
  const std::string model_prefix = kModelPrefix, old_prefix = kOldPrefix;
  return std::make_unique<RenamedWeightSource>(
      checkpoint,
      [&checkpoint, model_prefix, old_prefix](const std::string& n) {
        if (checkpoint.contains(n) || !starts_with(n, model_prefix)) return n;
        return old_prefix + n.substr(model_prefix.size());
      },
      [model_prefix, old_prefix](const std::string& n) {
        if (starts_with(n, old_prefix)) return model_prefix + n.substr(old_prefix.size());
        return n;
      });
}

TensorParallelPlan Mistral3TextModel::tp_plan() const {
  TensorParallelPlan plan;
  const auto col = ParallelStyle::colwise, row = ParallelStyle::rowwise;
  const std::string layer = std::string(kModelPrefix) + "layers.*.";
  for (const char* name : {"q_proj", "k_proj", "v_proj"})
    plan.entries.push_back({layer + "self_attn." + name, col, {}});
  plan.entries.push_back({layer + "self_attn.o_proj", row, {}});
  for (const char* name : {"gate_proj", "up_proj"})
    plan.entries.push_back({layer + "mlp." + name, col, {}});
  plan.entries.push_back({layer + "mlp.down_proj", row, {}});
  plan.divisible = {{"num_attention_heads", config_.num_attention_heads},
                    {"num_key_value_heads", config_.num_key_value_heads}};
  return plan;
}

bool Mistral3TextModel::ignored_tensor(const std::string& n) {
  for (const char* p :
       {"lm_head.", "language_model.lm_head.", "vision_tower.", "model.vision_tower.",
        "multi_modal_projector.", "model.multi_modal_projector."})
    if (starts_with(n, p)) return true;
  return false;
}

std::pair<Tensor, Tensor> Mistral3TextModel::rotary_tables(int64_t L) const {
  // As transformers' default RoPE: inv_freq = 1 / theta^(2i / d) in f32, angles pos * inv_freq
  // rounded to f32, both halves repeated (rotate_half layout), cos/sin of the f32 angle.
  const int64_t d = config_.head_dim, half = d / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(d);
    inv[size_t(i)] = 1.0f / float(std::pow(double(float(config_.rope_theta)), double(e)));
  }
  std::vector<float> c(size_t(L * d)), s(size_t(L * d));
  for (int64_t p = 0; p < L; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(p) * inv[size_t(i)];
      const float cv = float(std::cos(double(angle))), sv = float(std::sin(double(angle)));
      c[size_t(p * d + i)] = c[size_t(p * d + i + half)] = cv;
      s[size_t(p * d + i)] = s[size_t(p * d + i + half)] = sv;
    }
  return {Tensor::from_floats(c, {L, d}), Tensor::from_floats(s, {L, d})};
}

std::vector<std::string> Mistral3TextModel::capture_names(int64_t run) const {
  std::vector<std::string> names{"embed_tokens"};
  for (int64_t i = 0; i < run; ++i) {
    const std::string p = "layers." + std::to_string(i);
    for (const char* k :
         {"", ".input_layernorm", ".self_attn", ".post_attention_layernorm", ".mlp"})
      names.push_back(p + k);
  }
  if (run == int64_t(language_model.layers.size())) names.push_back("norm");
  for (auto& n : names) n = kModelPrefix + n;
  return names;
}

Mistral3TextOutput Mistral3TextModel::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                              int64_t num_layers,
                                              std::map<std::string, Tensor>* capture) const {
  const int64_t total = int64_t(language_model.layers.size());
  TESSERA_CHECK(num_layers <= total, kWhere, " asked for ", num_layers,
                " layers but the model has ", total);
  const int64_t run = num_layers < 0 ? total : num_layers;
  // Through call(): the hidden states (and captured activations) are its outputs; one variant
  // per layer count and capture.
  const std::vector<std::string> names = capture ? capture_names(run) : std::vector<std::string>{};
  const auto outs = call(
      {input_ids, attention_mask},
      [&](const std::vector<Tensor>& x) {
        std::map<std::string, Tensor> cap;
        std::vector<Tensor> r =
            forward_eager(x[0], x[1], run, capture ? &cap : nullptr).hidden_states;
        for (const auto& n : names) r.push_back(cap.at(n));
        return r;
      },
      2 * run + (capture ? 1 : 0));
  Mistral3TextOutput o;
  o.hidden_states.assign(outs.begin(), outs.begin() + (run + 1));
  for (size_t i = 0; i < names.size(); ++i) (*capture)[names[i]] = outs[size_t(run + 1) + i];
  return o;
}

Mistral3TextOutput Mistral3TextModel::forward_eager(const Tensor& input_ids,
                                                    const Tensor& attention_mask, int64_t run,
                                                    std::map<std::string, Tensor>* capture) const {
  TESSERA_CHECK(input_ids.defined() && input_ids.ndim() == 2 &&
                    (input_ids.dtype() == DType::i64 || input_ids.dtype() == DType::i32),
                kWhere, " input_ids must be (B, L) integers, got ",
                input_ids.defined() ? input_ids.describe() : "nothing");
  const int64_t B = input_ids.dim(0), L = input_ids.dim(1);
  const int64_t total = int64_t(language_model.layers.size());
  Tensor mask;
  if (attention_mask.defined()) {
    TESSERA_CHECK(attention_mask.shape() == Shape({B, L}), kWhere, " attention_mask must be (", B,
                  ", ", L, ") like input_ids, got ", attention_mask.describe());
    mask = astype(attention_mask.view({B, 1, 1, L}), DType::boolean);
  } else {
    mask = astype(Tensor::from_ints(std::vector<int64_t>(size_t(B * L), 1), {B, 1, 1, L}),
                  DType::boolean)
               .to(input_ids.device());
  }
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[kModelPrefix + name] = t;
  };
  // Built on the host, used where the ids are.
  const auto [cos_host, sin_host] = rotary_tables(L);
  const Tensor cos = cos_host.to(input_ids.device()), sin = sin_host.to(input_ids.device());

  Mistral3TextOutput out;
  Tensor h = language_model.embed_tokens(input_ids);
  record("embed_tokens", h);
  out.hidden_states.push_back(h);
  for (int64_t i = 0; i < run; ++i) {
    const auto r = (*language_model.layers[size_t(i)])(h, cos, sin, mask, capture != nullptr);
    h = r[0];
    if (capture) {
      const std::string p = "layers." + std::to_string(i);
      record(p, h);
      record(p + ".input_layernorm", r[1]);
      record(p + ".self_attn", r[2]);
      record(p + ".post_attention_layernorm", r[3]);
      record(p + ".mlp", r[4]);
    }
    out.hidden_states.push_back(h);
  }
  if (run == total) {
    out.hidden_states.back() = language_model.norm(h);
    record("norm", out.hidden_states.back());
  }
  return out;
}

Tensor Mistral3TextModel::prompt_embeds(const Tensor& input_ids, const Tensor& attention_mask,
                                        const std::vector<int64_t>& layers) const {
  TESSERA_CHECK(!layers.empty(), kWhere, " no hidden-state layers asked for");
  const int64_t total = int64_t(language_model.layers.size());
  int64_t last = 0;
  for (int64_t k : layers) {
    TESSERA_CHECK(k >= 0 && k <= total, kWhere, " hidden_states[", k,
                  "] does not exist: the model has ", total, " layers (0..", total, ")");
    last = std::max(last, k);
  }
  // hidden_states[total] is after the final norm only when every layer runs, as forward gives.
  const Mistral3TextOutput o = forward(input_ids, attention_mask, last);
  std::vector<Tensor> parts;
  for (int64_t k : layers) parts.push_back(o.hidden_states[size_t(k)]);
  // stack(parts, 1).permute(0, 2, 1, 3).reshape(B, L, n * D) is the per-token concatenation.
  return concat(parts, 2);
}

}  // namespace tessera
