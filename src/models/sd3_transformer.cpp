#include "models/sd3_transformer.h"

#include <algorithm>

#include "nn/input_checks.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "[SD3Transformer2DModel]";

void require_positive(const JsonConfig& c, const std::string& key, int64_t v) {
  TESSERA_CHECK(v > 0, kWhere, " unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

std::string describe(const Tensor& t) {
  return t.defined() ? t.describe() : "nothing";
}

}  // namespace

bool SD3TransformerConfig::dual_attention(int64_t layer) const {
  return std::find(dual_attention_layers.begin(), dual_attention_layers.end(), layer) !=
         dual_attention_layers.end();
}

SD3TransformerConfig SD3TransformerConfig::from_json(const JsonConfig& c) {
  const std::string class_name = c.get_string("_class_name", "SD3Transformer2DModel");
  TESSERA_CHECK(class_name == "SD3Transformer2DModel", kWhere, " unsupported _class_name '",
                class_name, "' in ", c.source(), "; expected SD3Transformer2DModel");
  SD3TransformerConfig cfg;
  cfg.sample_size = c.get_int("sample_size", 128);
  cfg.patch_size = c.get_int("patch_size", 2);
  cfg.in_channels = c.get_int("in_channels");
  cfg.out_channels = c.get_int("out_channels", cfg.in_channels);
  cfg.num_layers = c.get_int("num_layers");
  cfg.attention_head_dim = c.get_int("attention_head_dim");
  cfg.num_attention_heads = c.get_int("num_attention_heads");
  cfg.joint_attention_dim = c.get_int("joint_attention_dim");
  cfg.caption_projection_dim = c.get_int("caption_projection_dim");
  cfg.pooled_projection_dim = c.get_int("pooled_projection_dim");
  cfg.pos_embed_max_size = c.get_int("pos_embed_max_size", 96);
  if (c.has("dual_attention_layers"))
    cfg.dual_attention_layers = c.get_int_list("dual_attention_layers");
  const std::string qk_norm = c.get_string("qk_norm", "");
  TESSERA_CHECK(qk_norm.empty() || qk_norm == "rms_norm", kWhere, " unsupported value qk_norm='",
                qk_norm, "' in ", c.source(), "; SD3 checkpoints use null or \"rms_norm\"");
  cfg.qk_rms_norm = qk_norm == "rms_norm";

  for (const char* key : {"sample_size", "patch_size", "in_channels", "out_channels",
                          "attention_head_dim", "num_attention_heads", "joint_attention_dim",
                          "caption_projection_dim", "pooled_projection_dim", "pos_embed_max_size"})
    require_positive(c, key, c.get_int(key, 1));
  require_positive(c, "num_layers", cfg.num_layers);
  require_positive(c, "out_channels", cfg.out_channels);
  // Every block runs at inner_dim; diffusers would fail inside the first block otherwise.
  TESSERA_CHECK(cfg.caption_projection_dim == cfg.inner_dim(), kWhere,
                " unsupported value caption_projection_dim=", cfg.caption_projection_dim, " in ",
                c.source(),
                "; the blocks need num_attention_heads * attention_head_dim = ", cfg.inner_dim());
  TESSERA_CHECK(cfg.inner_dim() % 4 == 0, kWhere, " unsupported inner dim ", cfg.inner_dim(),
                " in ", c.source(), "; the 2-D position table needs a multiple of 4");
  for (int64_t l : cfg.dual_attention_layers)
    TESSERA_CHECK(l >= 0 && l < cfg.num_layers, kWhere,
                  " unsupported value dual_attention_layers containing ", l, " in ", c.source(),
                  "; layers are 0..", cfg.num_layers - 1);
  return cfg;
}

JointTransformerBlock::JointTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                             bool pre_only, bool qk_rms_norm, bool dual)
    : context_pre_only(pre_only),
      use_dual_attention(dual),
      attn(dim, heads, head_dim, qk_rms_norm, /*context=*/true, pre_only),
      norm2(dim, 1e-6, /*elementwise_affine=*/false),
      ff(dim, dim) {
  if (dual) {
    norm1_x = std::make_unique<nn::SD35AdaLayerNormZeroX>(dim);
    register_module("norm1", norm1_x.get());
  } else {
    norm1 = std::make_unique<nn::AdaLayerNormZero>(dim);
    register_module("norm1", norm1.get());
  }
  if (pre_only) {
    norm1_context_last = std::make_unique<nn::AdaLayerNormContinuous>(dim, dim, 1e-6);
    register_module("norm1_context", norm1_context_last.get());
  } else {
    norm1_context = std::make_unique<nn::AdaLayerNormZero>(dim);
    register_module("norm1_context", norm1_context.get());
  }
  register_module("attn", &attn);
  if (dual) {
    attn2 = std::make_unique<nn::JointAttention>(dim, heads, head_dim, qk_rms_norm,
                                                 /*context=*/false, false);
    register_module("attn2", attn2.get());
  }
  register_module("norm2", &norm2);
  register_module("ff", &ff);
  if (!pre_only) {
    norm2_context = std::make_unique<nn::LayerNorm>(dim, 1e-6, false);
    ff_context = std::make_unique<nn::FeedForward>(dim, dim);
    register_module("norm2_context", norm2_context.get());
    register_module("ff_context", ff_context.get());
  }
}

std::vector<std::string> JointTransformerBlock::capture_names() const {
  std::vector<std::string> n = {"norm1", "norm1.gate_msa", "norm1.shift_mlp", "norm1.scale_mlp",
                                "norm1.gate_mlp"};
  if (use_dual_attention) {
    n.push_back("norm1.norm_hidden_states2");
    n.push_back("norm1.gate_msa2");
  }
  n.push_back("attn.hidden_states");
  n.push_back("attn.encoder_hidden_states");
  if (use_dual_attention) n.push_back("attn2");
  return n;
}

SD3BlockOutput JointTransformerBlock::operator()(const Tensor& hidden_states,
                                                 const Tensor& encoder_hidden_states,
                                                 const Tensor& temb,
                                                 std::map<std::string, Tensor>* capture,
                                                 const std::string& prefix) const {
  // The variant tells apart the output sets (captures) and the block kinds sharing the class.
  const int64_t variant =
      (capture ? 1 : 0) | (use_dual_attention ? 2 : 0) | (context_pre_only ? 4 : 0);
  const auto out = call(
      {hidden_states, encoder_hidden_states, temb},
      [this, capture](const std::vector<Tensor>& in) {
        return forward_impl(in[0], in[1], in[2], capture != nullptr);
      },
      variant);
  // Outputs: hidden_states, encoder_hidden_states (unless context_pre_only), then captures.
  size_t i = 0;
  SD3BlockOutput r;
  r.hidden_states = out[i++];
  if (!context_pre_only) r.encoder_hidden_states = out[i++];
  if (capture)
    for (const auto& name : capture_names()) (*capture)[prefix + name] = out[i++];
  return r;
}

std::vector<Tensor> JointTransformerBlock::forward_impl(const Tensor& hidden_states,
                                                        const Tensor& encoder_hidden_states,
                                                        const Tensor& temb, bool capture) const {
  Tensor norm_hs, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_hs2, gate_msa2;
  if (use_dual_attention) {
    auto n = (*norm1_x)(hidden_states, temb);
    norm_hs = n.x, gate_msa = n.gate_msa, shift_mlp = n.shift_mlp, scale_mlp = n.scale_mlp;
    gate_mlp = n.gate_mlp, norm_hs2 = n.norm_hidden_states2, gate_msa2 = n.gate_msa2;
  } else {
    auto n = (*norm1)(hidden_states, temb);
    norm_hs = n.x, gate_msa = n.gate_msa, shift_mlp = n.shift_mlp, scale_mlp = n.scale_mlp;
    gate_mlp = n.gate_mlp;
  }
  Tensor norm_enc, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp;
  if (context_pre_only) {
    norm_enc = (*norm1_context_last)(encoder_hidden_states, temb);
  } else {
    auto nc = (*norm1_context)(encoder_hidden_states, temb);
    norm_enc = nc.x, c_gate_msa = nc.gate_msa, c_shift_mlp = nc.shift_mlp;
    c_scale_mlp = nc.scale_mlp, c_gate_mlp = nc.gate_mlp;
  }

  const auto a = attn(norm_hs, norm_enc);
  Tensor hs = hidden_states + gate_msa.unsqueeze(1) * a.hidden_states;
  Tensor attn2_out;
  if (use_dual_attention) {
    attn2_out = (*attn2)(norm_hs2, Tensor()).hidden_states;
    hs = hs + gate_msa2.unsqueeze(1) * attn2_out;
  }
  const Tensor ff_out = ff(nn::modulate(norm2(hs), shift_mlp, scale_mlp));
  hs = hs + gate_mlp.unsqueeze(1) * ff_out;

  std::vector<Tensor> out{hs};
  if (!context_pre_only) {
    Tensor enc = encoder_hidden_states + c_gate_msa.unsqueeze(1) * a.encoder_hidden_states;
    const Tensor ctx_ff =
        (*ff_context)(nn::modulate((*norm2_context)(enc), c_shift_mlp, c_scale_mlp));
    out.push_back(enc + c_gate_mlp.unsqueeze(1) * ctx_ff);
  }
  if (capture) {
    for (const Tensor& t : {norm_hs, gate_msa, shift_mlp, scale_mlp, gate_mlp}) out.push_back(t);
    if (use_dual_attention) {
      out.push_back(norm_hs2);
      out.push_back(gate_msa2);
    }
    out.push_back(a.hidden_states);
    out.push_back(a.encoder_hidden_states);
    if (use_dual_attention) out.push_back(attn2_out);
  }
  return out;
}

SD3Transformer2DModel::SD3Transformer2DModel(const SD3TransformerConfig& cfg)
    : config(cfg),
      pos_embed(cfg.sample_size, cfg.patch_size, cfg.in_channels, cfg.inner_dim(),
                cfg.pos_embed_max_size),
      time_text_embed(cfg.inner_dim(), cfg.pooled_projection_dim, /*guidance_embeds=*/false),
      context_embedder(cfg.joint_attention_dim, cfg.caption_projection_dim),
      norm_out(cfg.inner_dim(), cfg.inner_dim(), 1e-6),
      proj_out(cfg.inner_dim(), cfg.patch_size * cfg.patch_size * cfg.out_channels) {
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    transformer_blocks.push_back(std::make_unique<JointTransformerBlock>(
        cfg.inner_dim(), cfg.num_attention_heads, cfg.attention_head_dim,
        /*context_pre_only=*/i == cfg.num_layers - 1, cfg.qk_rms_norm, cfg.dual_attention(i)));
  register_module("pos_embed", &pos_embed);
  register_module("time_text_embed", &time_text_embed);
  register_module("context_embedder", &context_embedder);
  register_modules("transformer_blocks", transformer_blocks);
  register_module("norm_out", &norm_out);
  register_module("proj_out", &proj_out);
}

TensorParallelPlan SD3Transformer2DModel::tp_plan() const {
  TensorParallelPlan plan;
  const auto col = ParallelStyle::colwise, row = ParallelStyle::rowwise;
  for (const char* name : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                           "attn.add_k_proj", "attn.add_v_proj", "attn2.to_q", "attn2.to_k",
                           "attn2.to_v", "ff.net.0.proj", "ff_context.net.0.proj"})
    plan.entries.push_back({std::string("transformer_blocks.*.") + name, col, {}});
  for (const char* name : {"attn.to_out.0", "attn.to_add_out", "attn2.to_out.0", "ff.net.2",
                           "ff_context.net.2"})
    plan.entries.push_back({std::string("transformer_blocks.*.") + name, row, {}});
  plan.divisible = {{"num_attention_heads", config.num_attention_heads}};
  return plan;
}

std::vector<std::string> SD3Transformer2DModel::capture_names(
    const std::vector<int64_t>& skip) const {
  std::vector<std::string> names = {"pos_embed", "time_text_embed", "context_embedder"};
  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    if (std::find(skip.begin(), skip.end(), int64_t(i)) != skip.end()) continue;
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    for (const auto& n : transformer_blocks[i]->capture_names()) names.push_back(p + n);
    if (!transformer_blocks[i]->context_pre_only) names.push_back(p + "encoder_hidden_states");
    names.push_back(p + "hidden_states");
  }
  names.push_back("norm_out");
  names.push_back("proj_out");
  return names;
}

Tensor SD3Transformer2DModel::forward(const SD3TransformerInputs& in,
                                      std::map<std::string, Tensor>* capture) const {
  // The skipped layers change the graph: they are part of the variant (bits above the capture
  // bit), so each skip set gets its own program.
  int64_t variant = capture ? 1 : 0;
  for (int64_t l : in.skip_layers) {
    TESSERA_CHECK(l >= 0 && l < config.num_layers, kWhere, " skip_layers names layer ", l,
                  "; this model has layers 0..", config.num_layers - 1);
    TESSERA_CHECK(l < 62, kWhere, " skip_layers supports layers below 62, got ", l);
    variant |= int64_t(1) << (l + 1);
  }
  const std::vector<std::string> names =
      capture ? capture_names(in.skip_layers) : std::vector<std::string>{};
  const auto outs = call(
      {in.hidden_states, in.encoder_hidden_states, in.pooled_projections, in.timestep},
      [&](const std::vector<Tensor>& x) {
        std::map<std::string, Tensor> cap;
        const Tensor sample =
            forward_eager({x[0], x[1], x[2], x[3], in.skip_layers}, capture ? &cap : nullptr);
        std::vector<Tensor> r{sample};
        for (const auto& n : names) r.push_back(cap.at(n));
        return r;
      },
      variant);
  for (size_t i = 0; i < names.size(); ++i) (*capture)[names[i]] = outs[i + 1];
  return outs[0];
}

Tensor SD3Transformer2DModel::forward_eager(const SD3TransformerInputs& in,
                                            std::map<std::string, Tensor>* capture) const {
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[name] = t;
  };
  const SD3TransformerConfig& c = config;
  const Tensor& x = in.hidden_states;
  TESSERA_CHECK(x.defined() && x.ndim() == 4 && x.dim(1) == c.in_channels &&
                    x.dim(2) % c.patch_size == 0 && x.dim(3) % c.patch_size == 0,
                kWhere, " hidden_states must be (B, ", c.in_channels,
                ", H, W) with H and W multiples of patch_size ", c.patch_size, ", got ",
                describe(x));
  const int64_t B = x.dim(0);
  const Tensor& enc_in = in.encoder_hidden_states;
  nn::check_input_shape(kWhere, "encoder_hidden_states", enc_in,
                        {B, "L_txt", c.joint_attention_dim});
  const Tensor& pooled = in.pooled_projections;
  nn::check_input_shape(kWhere, "pooled_projections", pooled, {B, c.pooled_projection_dim});
  nn::check_input_shape(kWhere, "timestep", in.timestep, {B});

  const DType dt = dtype_;
  const int64_t h = x.dim(2) / c.patch_size, w = x.dim(3) / c.patch_size;
  Tensor hidden_states = pos_embed(astype(x, dt));
  record("pos_embed", hidden_states);
  // The timestep stays as given (float32 from the scheduler); the sinusoidal projection is f32.
  const Tensor temb = time_text_embed(in.timestep, Tensor(), astype(pooled, dt));
  record("time_text_embed", temb);
  Tensor encoder_hidden_states = context_embedder(astype(enc_in, dt));
  record("context_embedder", encoder_hidden_states);

  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    if (std::find(in.skip_layers.begin(), in.skip_layers.end(), int64_t(i)) != in.skip_layers.end())
      continue;
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    const auto out =
        (*transformer_blocks[i])(hidden_states, encoder_hidden_states, temb, capture, p);
    hidden_states = out.hidden_states;
    if (!transformer_blocks[i]->context_pre_only) {
      encoder_hidden_states = out.encoder_hidden_states;
      record(p + "encoder_hidden_states", encoder_hidden_states);
    }
    record(p + "hidden_states", hidden_states);
  }

  hidden_states = norm_out(hidden_states, temb);
  record("norm_out", hidden_states);
  Tensor sample = proj_out(hidden_states);
  record("proj_out", sample);
  // Unpatchify: (B, h*w, p*p*C) -> (B, C, h*p, w*p), as einsum("nhwpqc->nchpwq").
  const int64_t p = c.patch_size;
  return contiguous(sample.view({B, h, w, p, p, c.out_channels}).permute({0, 5, 1, 3, 2, 4}))
      .view({B, c.out_channels, h * p, w * p});
}

}  // namespace tessera
