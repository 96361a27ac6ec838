#include "models/flux_transformer.h"

#include "nn/input_checks.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "[FluxTransformer2DModel]";

void require_positive(const JsonConfig& c, const std::string& key, int64_t v) {
  TESSERA_CHECK(v > 0, kWhere, " unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

// ids (L, n) or the deprecated batched (B, L, n), of which diffusers keeps the first row.
Tensor unbatched_ids(const Tensor& ids, const char* name) {
  TESSERA_CHECK(ids.defined(), kWhere, " ", name, " is required");
  TESSERA_CHECK(ids.ndim() == 2 || ids.ndim() == 3, kWhere, " ", name, " must be (L, 3), got ",
                ids.describe());
  return ids.ndim() == 3 ? ids.select(0, 0) : ids;
}

// diffusers clips fp16 residual streams to the finite range.
Tensor clip_f16(const Tensor& x) {
  if (x.dtype() != DType::f16) return x;
  return minimum(maximum(x, -65504.0), 65504.0);
}

}  // namespace

FluxTransformerBlock::FluxTransformerBlock(int64_t dim, int64_t num_heads, int64_t head_dim)
    : norm1(dim),
      norm1_context(dim),
      attn(dim, num_heads, head_dim, /*added_kv_proj=*/true, /*pre_only=*/false, 1e-6),
      norm2(dim, 1e-6, /*elementwise_affine=*/false),
      norm2_context(dim, 1e-6, /*elementwise_affine=*/false),
      ff(dim, dim),
      ff_context(dim, dim) {
  register_module("norm1", &norm1);
  register_module("norm1_context", &norm1_context);
  register_module("attn", &attn);
  register_module("norm2", &norm2);
  register_module("ff", &ff);
  register_module("norm2_context", &norm2_context);
  register_module("ff_context", &ff_context);
}

FluxBlockOutput FluxTransformerBlock::operator()(const Tensor& hidden_states,
                                                 const Tensor& encoder_hidden_states,
                                                 const Tensor& temb,
                                                 const nn::RotaryEmbedding& rotary) const {
  const auto out = call(
      {hidden_states, encoder_hidden_states, temb, rotary.cos, rotary.sin},
      [this](const std::vector<Tensor>& in) {
        const FluxBlockOutput o =
            forward_impl(in[0], in[1], in[2], nn::RotaryEmbedding{in[3], in[4]});
        return std::vector<Tensor>{o.encoder_hidden_states, o.hidden_states};
      });
  return {out[0], out[1]};
}

FluxBlockOutput FluxTransformerBlock::forward_impl(const Tensor& hidden_states,
                                                   const Tensor& encoder_hidden_states,
                                                   const Tensor& temb,
                                                   const nn::RotaryEmbedding& rotary) const {
  auto n = norm1(hidden_states, temb);
  auto nc = norm1_context(encoder_hidden_states, temb);
  auto a = attn(n.x, nc.x, &rotary);

  Tensor hs = hidden_states + n.gate_msa.unsqueeze(1) * a.hidden_states;
  Tensor ff_out = ff(nn::modulate(norm2(hs), n.shift_mlp, n.scale_mlp));
  hs = hs + n.gate_mlp.unsqueeze(1) * ff_out;

  Tensor enc = encoder_hidden_states + nc.gate_msa.unsqueeze(1) * a.encoder_hidden_states;
  Tensor ctx_ff_out = ff_context(nn::modulate(norm2_context(enc), nc.shift_mlp, nc.scale_mlp));
  enc = clip_f16(enc + nc.gate_mlp.unsqueeze(1) * ctx_ff_out);
  return {enc, hs};
}

FluxSingleTransformerBlock::FluxSingleTransformerBlock(int64_t dim, int64_t num_heads,
                                                       int64_t head_dim, double mlp_ratio)
    : mlp_hidden_dim(int64_t(double(dim) * mlp_ratio)),
      norm(dim),
      proj_mlp(dim, mlp_hidden_dim),
      proj_out(dim + mlp_hidden_dim, dim),
      attn(dim, num_heads, head_dim, /*added_kv_proj=*/false, /*pre_only=*/true, 1e-6) {
  register_module("norm", &norm);
  register_module("proj_mlp", &proj_mlp);
  register_module("proj_out", &proj_out);
  register_module("attn", &attn);
}

FluxBlockOutput FluxSingleTransformerBlock::operator()(const Tensor& hidden_states,
                                                       const Tensor& encoder_hidden_states,
                                                       const Tensor& temb,
                                                       const nn::RotaryEmbedding& rotary) const {
  const int64_t text_len = encoder_hidden_states.dim(1);
  const Tensor hs = forward_joint(concat({encoder_hidden_states, hidden_states}, 1), temb, rotary);
  return {hs.slice(1, 0, text_len), hs.slice(1, text_len, hs.dim(1))};
}

Tensor FluxSingleTransformerBlock::forward_joint(const Tensor& residual, const Tensor& temb,
                                                 const nn::RotaryEmbedding& rotary) const {
  return call({residual, temb, rotary.cos, rotary.sin}, [this](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{forward_joint_impl(in[0], in[1], nn::RotaryEmbedding{in[2], in[3]})};
  })[0];
}

Tensor FluxSingleTransformerBlock::forward_joint_impl(const Tensor& residual, const Tensor& temb,
                                                      const nn::RotaryEmbedding& rotary) const {
  auto n = norm(residual, temb);
  Tensor mlp = gelu(proj_mlp(n.x), true);
  Tensor attn_out = attn(n.x, Tensor(), &rotary).hidden_states;
  Tensor hs = n.gate_msa.unsqueeze(1) * proj_out(concat({attn_out, mlp}, 2));
  return clip_f16(residual + hs);
}

FluxTransformerConfig FluxTransformerConfig::from_json(const JsonConfig& c) {
  const std::string class_name = c.get_string("_class_name", "FluxTransformer2DModel");
  TESSERA_CHECK(class_name == "FluxTransformer2DModel", kWhere, " unsupported _class_name '",
                class_name, "' in ", c.source(), "; expected FluxTransformer2DModel");
  FluxTransformerConfig cfg;
  cfg.patch_size = c.get_int("patch_size", 1);
  cfg.in_channels = c.get_int("in_channels");
  cfg.out_channels = c.get_int("out_channels", cfg.in_channels);
  cfg.num_layers = c.get_int("num_layers");
  cfg.num_single_layers = c.get_int("num_single_layers");
  cfg.attention_head_dim = c.get_int("attention_head_dim");
  cfg.num_attention_heads = c.get_int("num_attention_heads");
  cfg.joint_attention_dim = c.get_int("joint_attention_dim");
  cfg.pooled_projection_dim = c.get_int("pooled_projection_dim");
  cfg.guidance_embeds = c.get_bool("guidance_embeds", false);
  cfg.axes_dims_rope = c.get_int_list("axes_dims_rope");

  require_positive(c, "patch_size", cfg.patch_size);
  require_positive(c, "in_channels", cfg.in_channels);
  require_positive(c, "out_channels", cfg.out_channels);
  TESSERA_CHECK(cfg.num_layers >= 0, kWhere, " unsupported value num_layers=", cfg.num_layers,
                " in ", c.source());
  TESSERA_CHECK(cfg.num_single_layers >= 0, kWhere,
                " unsupported value num_single_layers=", cfg.num_single_layers, " in ", c.source());
  require_positive(c, "attention_head_dim", cfg.attention_head_dim);
  require_positive(c, "num_attention_heads", cfg.num_attention_heads);
  require_positive(c, "joint_attention_dim", cfg.joint_attention_dim);
  require_positive(c, "pooled_projection_dim", cfg.pooled_projection_dim);
  // The rotary tables cover each head exactly, one even slice per position axis.
  int64_t rope_dim = 0;
  for (int64_t d : cfg.axes_dims_rope) {
    TESSERA_CHECK(d > 0 && d % 2 == 0, kWhere, " unsupported value axes_dims_rope containing ", d,
                  " in ", c.source(), "; every axis needs a positive even size");
    rope_dim += d;
  }
  TESSERA_CHECK(!cfg.axes_dims_rope.empty() && rope_dim == cfg.attention_head_dim, kWhere,
                " unsupported value axes_dims_rope (sum ", rope_dim, ") in ", c.source(),
                "; the axes must add up to attention_head_dim=", cfg.attention_head_dim);
  return cfg;
}

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& cfg)
    : config(cfg),
      pos_embed(10000.0, cfg.axes_dims_rope),
      time_text_embed(cfg.inner_dim(), cfg.pooled_projection_dim, cfg.guidance_embeds),
      context_embedder(cfg.joint_attention_dim, cfg.inner_dim()),
      x_embedder(cfg.in_channels, cfg.inner_dim()),
      norm_out(cfg.inner_dim(), cfg.inner_dim(), 1e-6),
      proj_out(cfg.inner_dim(), cfg.patch_size * cfg.patch_size * cfg.out_channels) {
  const int64_t dim = cfg.inner_dim();
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    transformer_blocks.push_back(std::make_unique<FluxTransformerBlock>(
        dim, cfg.num_attention_heads, cfg.attention_head_dim));
  for (int64_t i = 0; i < cfg.num_single_layers; ++i)
    single_transformer_blocks.push_back(std::make_unique<FluxSingleTransformerBlock>(
        dim, cfg.num_attention_heads, cfg.attention_head_dim));
  register_module("time_text_embed", &time_text_embed);
  register_module("context_embedder", &context_embedder);
  register_module("x_embedder", &x_embedder);
  register_modules("transformer_blocks", transformer_blocks);
  register_modules("single_transformer_blocks", single_transformer_blocks);
  register_module("norm_out", &norm_out);
  register_module("proj_out", &proj_out);
}

TensorParallelPlan FluxTransformer2DModel::tp_plan() const {
  TensorParallelPlan plan;
  const auto col = ParallelStyle::colwise, row = ParallelStyle::rowwise;
  for (const char* name : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"})
    plan.entries.push_back({std::string("transformer_blocks.*.attn.") + name, col, {}});
  plan.entries.push_back({"transformer_blocks.*.attn.to_out.0", row, {}});
  plan.entries.push_back({"transformer_blocks.*.attn.to_add_out", row, {}});
  for (const char* ff : {"ff", "ff_context"}) {
    plan.entries.push_back({std::string("transformer_blocks.*.") + ff + ".net.0.proj", col, {}});
    plan.entries.push_back({std::string("transformer_blocks.*.") + ff + ".net.2", row, {}});
  }
  for (const char* name : {"to_q", "to_k", "to_v"})
    plan.entries.push_back({std::string("single_transformer_blocks.*.attn.") + name, col, {}});
  plan.entries.push_back({"single_transformer_blocks.*.proj_mlp", col, {}});
  const int64_t mlp = single_transformer_blocks.empty() ? 0 : single_transformer_blocks[0]->mlp_hidden_dim;
  plan.entries.push_back({"single_transformer_blocks.*.proj_out", row, {config.inner_dim(), mlp}});
  plan.divisible = {{"num_attention_heads", config.num_attention_heads}};
  return plan;
}

std::vector<std::string> FluxTransformer2DModel::capture_names() const {
  std::vector<std::string> names = {"x_embedder", "time_text_embed", "context_embedder",
                                    "pos_embed.cos", "pos_embed.sin"};
  for (size_t i = 0; i < transformer_blocks.size(); ++i)
    for (const char* k : {".encoder_hidden_states", ".hidden_states"})
      names.push_back("transformer_blocks." + std::to_string(i) + k);
  for (size_t i = 0; i < single_transformer_blocks.size(); ++i)
    for (const char* k : {".encoder_hidden_states", ".hidden_states"})
      names.push_back("single_transformer_blocks." + std::to_string(i) + k);
  names.push_back("norm_out");
  names.push_back("proj_out");
  return names;
}

Tensor FluxTransformer2DModel::forward(const FluxTransformerInputs& in,
                                       std::map<std::string, Tensor>* capture) const {
  // Through call(): the inputs are its inputs; captured activations come back as extra outputs.
  const std::vector<std::string> names = capture ? capture_names() : std::vector<std::string>{};
  const auto outs = call(
      {in.hidden_states, in.encoder_hidden_states, in.pooled_projections, in.timestep, in.img_ids,
       in.txt_ids, in.guidance},
      [&](const std::vector<Tensor>& x) {
        std::map<std::string, Tensor> cap;
        const Tensor sample =
            forward_eager({x[0], x[1], x[2], x[3], x[4], x[5], x[6]}, capture ? &cap : nullptr);
        std::vector<Tensor> r{sample};
        for (const auto& n : names) r.push_back(cap.at(n));
        return r;
      },
      capture ? 1 : 0);
  for (size_t i = 0; i < names.size(); ++i) (*capture)[names[i]] = outs[i + 1];
  return outs[0];
}

Tensor FluxTransformer2DModel::forward_eager(const FluxTransformerInputs& in,
                                             std::map<std::string, Tensor>* capture) const {
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[name] = t;
  };
  const FluxTransformerConfig& c = config;
  nn::check_input_shape(kWhere, "hidden_states", in.hidden_states, {"B", "L_img", c.in_channels});
  const int64_t B = in.hidden_states.dim(0);
  nn::check_input_shape(kWhere, "encoder_hidden_states", in.encoder_hidden_states,
                        {B, "L_txt", c.joint_attention_dim});
  nn::check_input_shape(kWhere, "pooled_projections", in.pooled_projections,
                        {B, c.pooled_projection_dim});
  nn::check_input_shape(kWhere, "timestep", in.timestep, {B});
  if (c.guidance_embeds) {
    TESSERA_CHECK(in.guidance.defined() && in.guidance.ndim() == 1 && in.guidance.dim(0) == B,
                  kWhere, " this model has guidance_embeds=true (FLUX.1-dev): guidance must be (",
                  B, ",), got ", in.guidance.defined() ? in.guidance.describe() : "nothing");
  } else {
    TESSERA_CHECK(!in.guidance.defined(), kWhere,
                  " guidance was given but this model has guidance_embeds=false");
  }
  const Tensor txt_ids = unbatched_ids(in.txt_ids, "txt_ids");
  const Tensor img_ids = unbatched_ids(in.img_ids, "img_ids");
  TESSERA_CHECK(txt_ids.dim(0) == in.encoder_hidden_states.dim(1) &&
                    img_ids.dim(0) == in.hidden_states.dim(1),
                kWhere, " txt_ids ", txt_ids.describe(), " and img_ids ", img_ids.describe(),
                " must have one row per text and image token (", in.encoder_hidden_states.dim(1),
                " and ", in.hidden_states.dim(1), ")");

  // Activations run in the model dtype (torch would refuse a mismatch; we convert).
  const DType dt = dtype_;
  Tensor hidden_states = x_embedder(astype(in.hidden_states, dt));
  record("x_embedder", hidden_states);

  // diffusers scales in the activation dtype: bf16 timesteps round after the * 1000.
  const Tensor timestep = astype(in.timestep, dt) * 1000.0;
  const Tensor guidance = in.guidance.defined() ? astype(in.guidance, dt) * 1000.0 : Tensor();
  const Tensor temb = time_text_embed(timestep, guidance, astype(in.pooled_projections, dt));
  record("time_text_embed", temb);

  Tensor encoder_hidden_states = context_embedder(astype(in.encoder_hidden_states, dt));
  record("context_embedder", encoder_hidden_states);

  const nn::RotaryEmbedding rotary = pos_embed(concat({txt_ids, img_ids}, 0));
  record("pos_embed.cos", rotary.cos);
  record("pos_embed.sin", rotary.sin);

  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    const auto out = (*transformer_blocks[i])(hidden_states, encoder_hidden_states, temb, rotary);
    encoder_hidden_states = out.encoder_hidden_states;
    hidden_states = out.hidden_states;
    if (capture) {
      const std::string p = "transformer_blocks." + std::to_string(i);
      record(p + ".encoder_hidden_states", encoder_hidden_states);
      record(p + ".hidden_states", hidden_states);
    }
  }
  if (!single_transformer_blocks.empty()) {
    // Single blocks run on the joint [text, image] sequence; their per-block outputs are views.
    const int64_t text_len = encoder_hidden_states.dim(1);
    Tensor joint = concat({encoder_hidden_states, hidden_states}, 1);
    for (size_t i = 0; i < single_transformer_blocks.size(); ++i) {
      joint = single_transformer_blocks[i]->forward_joint(joint, temb, rotary);
      if (capture) {
        const std::string p = "single_transformer_blocks." + std::to_string(i);
        record(p + ".encoder_hidden_states", joint.slice(1, 0, text_len));
        record(p + ".hidden_states", joint.slice(1, text_len, joint.dim(1)));
      }
    }
    hidden_states = joint.slice(1, text_len, joint.dim(1));
  }

  hidden_states = norm_out(hidden_states, temb);
  record("norm_out", hidden_states);
  Tensor sample = proj_out(hidden_states);
  record("proj_out", sample);
  return sample;
}

}  // namespace tessera
