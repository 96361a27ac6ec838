#include "models/clip_text_model.h"

#include <cmath>

#include "nn/checkpoint_source.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/reduce.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kTextModelPrefix = "text_model.";

// transformers 5 saves CLIPTextModel without the `text_model.` prefix that published checkpoints
// (and transformers 4) use, and reads both; load_weights serves the bare names under the prefix.
std::string without_text_model_prefix(const std::string& name) {
  return name.rfind(kTextModelPrefix, 0) == 0 ? name.substr(std::string(kTextModelPrefix).size())
                                              : name;
}
std::string with_text_model_prefix(const std::string& name) {
  return name.rfind("text_projection.", 0) == 0 ? name : kTextModelPrefix + name;
}

void require_positive(const JsonConfig& c, const char* key, int64_t v) {
  TESSERA_CHECK(v > 0, "[CLIPTextModel] unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

Tensor apply_activation(const std::string& name, const Tensor& x) {
  if (name == "quick_gelu") return quick_gelu(x);
  if (name == "gelu") return gelu(x);
  if (name == "gelu_pytorch_tanh") return gelu(x, /*approximate=*/true);
  return relu(x);  // from_json admits nothing else
}

}  // namespace

CLIPTextConfig CLIPTextConfig::from_json(const JsonConfig& c, bool with_projection) {
  const std::string model_type = c.get_string("model_type", "clip_text_model");
  TESSERA_CHECK(model_type == "clip_text_model", "[CLIPTextModel] unsupported value model_type='",
                model_type, "' in ", c.source(), "; expected clip_text_model");
  CLIPTextConfig cfg;
  cfg.vocab_size = c.get_int("vocab_size");
  cfg.hidden_size = c.get_int("hidden_size");
  cfg.intermediate_size = c.get_int("intermediate_size");
  cfg.num_hidden_layers = c.get_int("num_hidden_layers");
  cfg.num_attention_heads = c.get_int("num_attention_heads");
  cfg.max_position_embeddings = c.get_int("max_position_embeddings");
  if (with_projection) cfg.projection_dim = c.get_int("projection_dim");
  cfg.hidden_act = c.get_string("hidden_act", cfg.hidden_act);
  cfg.layer_norm_eps = c.get_float("layer_norm_eps", cfg.layer_norm_eps);
  cfg.eos_token_id = c.get_int("eos_token_id", cfg.eos_token_id);

  require_positive(c, "vocab_size", cfg.vocab_size);
  require_positive(c, "hidden_size", cfg.hidden_size);
  require_positive(c, "intermediate_size", cfg.intermediate_size);
  TESSERA_CHECK(cfg.num_hidden_layers >= 0,
                "[CLIPTextModel] unsupported value num_hidden_layers=", cfg.num_hidden_layers,
                " in ", c.source());
  require_positive(c, "num_attention_heads", cfg.num_attention_heads);
  require_positive(c, "max_position_embeddings", cfg.max_position_embeddings);
  if (with_projection) require_positive(c, "projection_dim", cfg.projection_dim);
  TESSERA_CHECK(cfg.hidden_size % cfg.num_attention_heads == 0,
                "[CLIPTextModel] unsupported value num_attention_heads=", cfg.num_attention_heads,
                " in ", c.source(), "; it must divide hidden_size=", cfg.hidden_size);
  const auto& a = cfg.hidden_act;
  TESSERA_CHECK(a == "quick_gelu" || a == "gelu" || a == "gelu_pytorch_tanh" || a == "relu",
                "[CLIPTextModel] unsupported value hidden_act='", a, "' in ", c.source(),
                "; expected quick_gelu, gelu, gelu_pytorch_tanh or relu");
  return cfg;
}

namespace clip {

CLIPTextEmbeddings::CLIPTextEmbeddings(const CLIPTextConfig& c)
    : token_embedding(c.vocab_size, c.hidden_size),
      position_embedding(c.max_position_embeddings, c.hidden_size) {
  register_module("token_embedding", &token_embedding);
  register_module("position_embedding", &position_embedding);
}

Tensor CLIPTextEmbeddings::forward(const Tensor& input_ids) const {
  // position_ids = arange(L): the first L rows of the table, a view.
  const int64_t L = input_ids.dim(1);
  return token_embedding(input_ids) + position_embedding.weight.slice(0, 0, L);
}

CLIPAttention::CLIPAttention(const CLIPTextConfig& c)
    : num_heads(c.num_attention_heads),
      head_dim(c.head_dim()),
      q_proj(c.hidden_size, c.hidden_size),
      k_proj(c.hidden_size, c.hidden_size),
      v_proj(c.hidden_size, c.hidden_size),
      out_proj(c.hidden_size, c.hidden_size) {
  register_module("k_proj", &k_proj);
  register_module("v_proj", &v_proj);
  register_module("q_proj", &q_proj);
  register_module("out_proj", &out_proj);
}

Tensor CLIPAttention::forward(const Tensor& x, const Tensor& padding_mask) const {
  const int64_t B = x.dim(0), L = x.dim(1);
  auto heads = [&](const Tensor& t) { return t.view({B, L, num_heads, head_dim}).transpose(1, 2); };
  SdpaOptions opt;
  opt.causal = true;
  opt.scale = std::pow(double(head_dim), -0.5);  // head_dim**-0.5, as the Python float
  opt.mask = padding_mask;
  const Tensor out =
      scaled_dot_product_attention(heads(q_proj(x)), heads(k_proj(x)), heads(v_proj(x)), opt);
  return out_proj(contiguous(out.transpose(1, 2)).flatten(2, 3));
}

CLIPMLP::CLIPMLP(const CLIPTextConfig& c)
    : activation(c.hidden_act),
      fc1(c.hidden_size, c.intermediate_size),
      fc2(c.intermediate_size, c.hidden_size) {
  register_module("fc1", &fc1);
  register_module("fc2", &fc2);
}

Tensor CLIPMLP::forward(const Tensor& x) const {
  return fc2(apply_activation(activation, fc1(x)));
}

CLIPEncoderLayer::CLIPEncoderLayer(const CLIPTextConfig& c)
    : self_attn(c),
      layer_norm1(c.hidden_size, c.layer_norm_eps),
      mlp(c),
      layer_norm2(c.hidden_size, c.layer_norm_eps) {
  register_module("self_attn", &self_attn);
  register_module("layer_norm1", &layer_norm1);
  register_module("mlp", &mlp);
  register_module("layer_norm2", &layer_norm2);
}

Tensor CLIPEncoderLayer::forward(const Tensor& x, const Tensor& padding_mask) const {
  const Tensor h = x + self_attn.forward(layer_norm1(x), padding_mask);
  return h + mlp.forward(layer_norm2(h));
}

CLIPTextTransformer::CLIPTextTransformer(const CLIPTextConfig& c)
    : config(c), embeddings(c), final_layer_norm(c.hidden_size, c.layer_norm_eps) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(std::make_unique<CLIPEncoderLayer>(c));
  register_module("embeddings", &embeddings);
  register_modules("encoder.layers", layers);
  register_module("final_layer_norm", &final_layer_norm);
}

CLIPTextOutput CLIPTextTransformer::forward(const Tensor& input_ids,
                                            const CLIPTextForwardOptions& options,
                                            std::map<std::string, Tensor>* capture,
                                            const std::string& prefix) const {
  constexpr const char* where = "[CLIPTextModel]";
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[prefix + name] = t;
  };
  TESSERA_CHECK(input_ids.defined() && input_ids.ndim() == 2 &&
                    (input_ids.dtype() == DType::i64 || input_ids.dtype() == DType::i32),
                where, " input_ids must be (B, L) i64, got ",
                input_ids.defined() ? input_ids.describe() : "nothing");
  const int64_t B = input_ids.dim(0), L = input_ids.dim(1);
  TESSERA_CHECK(
      L >= 1 && L <= config.max_position_embeddings, where, " sequence length ", L,
      " is out of range; expected 1 to max_position_embeddings=", config.max_position_embeddings);
  Tensor padding_mask;
  if (options.attention_mask.defined()) {
    const Tensor& m = options.attention_mask;
    TESSERA_CHECK(m.shape() == Shape({B, L}), where, " attention_mask must be (", B, ", ", L,
                  ") like input_ids, got ", m.describe());
    padding_mask = astype(m, DType::boolean).view({B, 1, 1, L});
  }

  CLIPTextOutput out;
  Tensor hidden = embeddings.forward(input_ids);
  record("embeddings", hidden);
  if (options.output_hidden_states) out.hidden_states.push_back(hidden);
  for (size_t i = 0; i < layers.size(); ++i) {
    hidden = layers[i]->forward(hidden, padding_mask);
    record("encoder.layers." + std::to_string(i), hidden);
    if (options.output_hidden_states) out.hidden_states.push_back(hidden);
  }
  out.last_hidden_state = final_layer_norm(hidden);
  record("final_layer_norm", out.last_hidden_state);

  // transformers pools at argmax(input_ids) when eos_token_id == 2 (configs older than its PR
  // #24773, e.g. FLUX.1's and SD3's) and at the first eos_token_id otherwise (0 when absent).
  Tensor eos_index;
  if (config.eos_token_id == 2) {
    eos_index = argmax(input_ids, -1);
  } else {
    const Tensor is_eos = 1.0 - minimum(abs(input_ids - double(config.eos_token_id)), 1.0);
    eos_index = argmax(is_eos, -1);
  }
  std::vector<int64_t> row_starts(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) row_starts[size_t(b)] = b * L;
  const Tensor flat_index = eos_index + Tensor::from_ints(row_starts, {B}).to(eos_index.device());
  out.pooler_output =
      embedding(out.last_hidden_state.view({B * L, config.hidden_size}), flat_index);
  return out;
}

}  // namespace clip

namespace {

// A CLIP text model's forward through Module::call unless activations are captured (they need
// eager): ids and the optional mask are the inputs; pooler_output, text_embeds (`projected`
// models) and hidden_states come back as extra outputs. `call` is the model's Module::call.
template <typename Eager, typename Call>
CLIPTextOutput clip_forward(bool projected, const Tensor& input_ids,
                            std::map<std::string, Tensor>* capture,
                            const CLIPTextForwardOptions& options, Eager&& eager, Call&& call) {
  if (capture) return eager(input_ids, capture, options);
  const auto outs = call(
      std::vector<Tensor>{input_ids, options.attention_mask},
      [&](const std::vector<Tensor>& x) {
        CLIPTextForwardOptions o = options;
        o.attention_mask = x[1];
        CLIPTextOutput r = eager(x[0], nullptr, o);
        std::vector<Tensor> v{r.last_hidden_state, r.pooler_output};
        if (projected) v.push_back(r.text_embeds);
        v.insert(v.end(), r.hidden_states.begin(), r.hidden_states.end());
        return v;
      },
      options.output_hidden_states ? 1 : 0);
  CLIPTextOutput r;
  r.last_hidden_state = outs[0];
  r.pooler_output = outs[1];
  if (projected) r.text_embeds = outs[2];
  r.hidden_states.assign(outs.begin() + (projected ? 3 : 2), outs.end());
  return r;
}

}  // namespace

std::unique_ptr<WeightSource> clip_weight_source(const CheckpointWeightSource& checkpoint) {
  if (checkpoint.contains("text_model.embeddings.token_embedding.weight")) return nullptr;
  return std::make_unique<RenamedWeightSource>(checkpoint, without_text_model_prefix,
                                               with_text_model_prefix);
}

bool clip_ignored_tensor(const std::string& name) {
  // Older checkpoints store the position_ids buffer; it is always arange(L).
  return name.find("embeddings.position_ids") != std::string::npos;
}

CLIPTextModel::CLIPTextModel(const CLIPTextConfig& c) : text_model(c) {
  register_module("text_model", &text_model);
}

CLIPTextOutput CLIPTextModel::forward(const Tensor& input_ids,
                                      std::map<std::string, Tensor>* capture,
                                      const CLIPTextForwardOptions& options) const {
  return clip_forward(
      false, input_ids, capture, options,
      [&](const Tensor& ids, std::map<std::string, Tensor>* cap, const CLIPTextForwardOptions& o) {
        return text_model.forward(ids, o, cap, kTextModelPrefix);
      },
      [&](const std::vector<Tensor>& in, const Body& body, int64_t variant) {
        return call(in, body, variant);
      });
}

CLIPTextModelWithProjection::CLIPTextModelWithProjection(const CLIPTextConfig& c)
    : text_model(c), text_projection(c.hidden_size, c.projection_dim, /*bias=*/false) {
  register_module("text_model", &text_model);
  register_module("text_projection", &text_projection);
}

CLIPTextOutput CLIPTextModelWithProjection::forward(const Tensor& input_ids,
                                                    std::map<std::string, Tensor>* capture,
                                                    const CLIPTextForwardOptions& options) const {
  return clip_forward(
      true, input_ids, capture, options,
      [&](const Tensor& ids, std::map<std::string, Tensor>* cap, const CLIPTextForwardOptions& o) {
        CLIPTextOutput out = text_model.forward(ids, o, cap, kTextModelPrefix);
        out.text_embeds = text_projection(out.pooler_output);
        if (cap) (*cap)["text_projection"] = out.text_embeds;
        return out;
      },
      [&](const std::vector<Tensor>& in, const Body& body, int64_t variant) {
        return call(in, body, variant);
      });
}

}  // namespace tessera
