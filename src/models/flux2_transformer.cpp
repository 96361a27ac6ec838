#include "models/flux2_transformer.h"

#include "ops/attention.h"
#include "nn/input_checks.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "[Flux2Transformer2DModel]";

void require_positive(const JsonConfig& c, const std::string& key, int64_t v) {
  TESSERA_CHECK(v > 0, kWhere, " unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

// ids (L, 4) or batched (B, L, 4), of which diffusers keeps the first row.
Tensor unbatched_ids(const Tensor& ids, const char* name, int64_t axes) {
  TESSERA_CHECK(ids.defined(), kWhere, " ", name, " is required");
  TESSERA_CHECK((ids.ndim() == 2 || ids.ndim() == 3) && ids.dim(ids.ndim() - 1) >= axes, kWhere,
                " ", name, " must be (L, ", axes, ") or (B, L, ", axes, "), got ", ids.describe());
  return ids.ndim() == 3 ? ids.select(0, 0) : ids;
}

// diffusers clips fp16 residual streams to the finite range.
Tensor clip_f16(const Tensor& x) {
  if (x.dtype() != DType::f16) return x;
  return minimum(maximum(x, -65504.0), 65504.0);
}

// (B, L, heads * head_dim) -> (B, L, heads, head_dim).
Tensor unflatten_heads(const Tensor& x, int64_t head_dim) {
  return x.view({x.dim(0), x.dim(1), -1, head_dim});
}

}  // namespace

Flux2FeedForward::Flux2FeedForward(int64_t dim, int64_t inner)
    : linear_in(dim, 2 * inner, false), linear_out(inner, dim, false) {
  register_module("linear_in", &linear_in);
  register_module("linear_out", &linear_out);
}

Tensor Flux2FeedForward::operator()(const Tensor& x) const {
  return linear_out(swiglu(linear_in(x), /*gate_first=*/true));
}

Flux2Modulation::Flux2Modulation(int64_t dim, int64_t sets) : linear(dim, 3 * sets * dim, false) {
  register_module("linear", &linear);
}

Tensor Flux2Modulation::operator()(const Tensor& temb) const {
  return linear(silu(temb));
}

Flux2TimestepGuidanceEmbeddings::Flux2TimestepGuidanceEmbeddings(int64_t in_channels, int64_t dim,
                                                                 bool guidance_embeds)
    : time_proj{in_channels, true, 0.0}, timestep_embedder(in_channels, dim, false) {
  register_module("timestep_embedder", &timestep_embedder);
  if (guidance_embeds) {
    guidance_embedder = std::make_unique<nn::TimestepEmbedding>(in_channels, dim, false);
    register_module("guidance_embedder", guidance_embedder.get());
  }
}

Tensor Flux2TimestepGuidanceEmbeddings::operator()(const Tensor& timestep,
                                                   const Tensor& guidance) const {
  // The sinusoidal projection is fp32; diffusers casts it to the timestep's dtype.
  Tensor emb = timestep_embedder(astype(time_proj(timestep), timestep.dtype()));
  if (guidance.defined() && guidance_embedder)
    emb = emb + (*guidance_embedder)(astype(time_proj(guidance), guidance.dtype()));
  return emb;
}

Flux2TransformerBlock::Flux2TransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                             int64_t mlp_hidden, double eps)
    : norm1(dim, eps, /*elementwise_affine=*/false),
      norm1_context(dim, eps, false),
      attn(dim, heads, head_dim, /*added_kv_proj=*/true, /*pre_only=*/false, eps, /*bias=*/false),
      norm2(dim, eps, false),
      norm2_context(dim, eps, false),
      ff(dim, mlp_hidden),
      ff_context(dim, mlp_hidden) {
  register_module("norm1", &norm1);
  register_module("norm1_context", &norm1_context);
  register_module("attn", &attn);
  register_module("norm2", &norm2);
  register_module("ff", &ff);
  register_module("norm2_context", &norm2_context);
  register_module("ff_context", &ff_context);
}

Flux2BlockOutput Flux2TransformerBlock::operator()(const Tensor& hidden_states,
                                                   const Tensor& encoder_hidden_states,
                                                   const Tensor& mod_img, const Tensor& mod_txt,
                                                   const nn::RotaryEmbedding& rotary,
                                                   bool with_attn) const {
  const auto out = call(
      {hidden_states, encoder_hidden_states, mod_img, mod_txt, rotary.cos, rotary.sin},
      [this, with_attn](const std::vector<Tensor>& in) {
        const Flux2BlockOutput o =
            forward_impl(in[0], in[1], in[2], in[3], nn::RotaryEmbedding{in[4], in[5]});
        std::vector<Tensor> r{o.encoder_hidden_states, o.hidden_states};
        if (with_attn) {
          r.push_back(o.attn_encoder_hidden_states);
          r.push_back(o.attn_hidden_states);
        }
        return r;
      },
      with_attn ? 1 : 0);
  Flux2BlockOutput o{out[0], out[1], Tensor(), Tensor()};
  if (with_attn) {
    o.attn_encoder_hidden_states = out[2];
    o.attn_hidden_states = out[3];
  }
  return o;
}

Flux2BlockOutput Flux2TransformerBlock::forward_impl(const Tensor& hs_in, const Tensor& enc_in,
                                                     const Tensor& mod_img, const Tensor& mod_txt,
                                                     const nn::RotaryEmbedding& rotary) const {
  // (shift, scale, gate) for attention, then for the MLP, per stream.
  const auto m = chunk(mod_img, 6, 1);
  const auto c = chunk(mod_txt, 6, 1);
  const auto a = attn(nn::modulate(norm1(hs_in), m[0], m[1]),
                      nn::modulate(norm1_context(enc_in), c[0], c[1]), &rotary);

  Tensor hs = hs_in + m[2].unsqueeze(1) * a.hidden_states;
  hs = hs + m[5].unsqueeze(1) * ff(nn::modulate(norm2(hs), m[3], m[4]));

  Tensor enc = enc_in + c[2].unsqueeze(1) * a.encoder_hidden_states;
  enc =
      clip_f16(enc + c[5].unsqueeze(1) * ff_context(nn::modulate(norm2_context(enc), c[3], c[4])));
  return {enc, hs, a.encoder_hidden_states, a.hidden_states};
}

TensorParallelPlan Flux2Transformer2DModel::tp_plan() const {
  TensorParallelPlan plan;
  const auto col = ParallelStyle::colwise, row = ParallelStyle::rowwise;
  const int64_t inner = config.inner_dim(), mlp = config.mlp_hidden_dim();
  for (const char* name : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"})
    plan.entries.push_back({std::string("transformer_blocks.*.attn.") + name, col, {}});
  plan.entries.push_back({"transformer_blocks.*.attn.to_out.0", row, {}});
  plan.entries.push_back({"transformer_blocks.*.attn.to_add_out", row, {}});
  for (const char* ff : {"ff", "ff_context"}) {
    plan.entries.push_back({std::string("transformer_blocks.*.") + ff + ".linear_in", col, {mlp, mlp}});
    plan.entries.push_back({std::string("transformer_blocks.*.") + ff + ".linear_out", row, {}});
  }
  plan.entries.push_back({"single_transformer_blocks.*.attn.to_qkv_mlp_proj", col,
                          {inner, inner, inner, mlp, mlp}});
  plan.entries.push_back({"single_transformer_blocks.*.attn.to_out", row, {inner, mlp}});
  plan.divisible = {{"num_attention_heads", config.num_attention_heads}};
  return plan;
}

Flux2ParallelSelfAttention::Flux2ParallelSelfAttention(int64_t dim, int64_t h, int64_t hd,
                                                       int64_t mlp_hidden, double eps)
    : heads(h),
      head_dim(hd),
      mlp_hidden_dim(mlp_hidden),
      to_qkv_mlp_proj(dim, 3 * h * hd + 2 * mlp_hidden, false),
      norm_q(hd, eps),
      norm_k(hd, eps),
      to_out(h * hd + mlp_hidden, dim, false) {
  register_module("to_qkv_mlp_proj", &to_qkv_mlp_proj);
  register_module("norm_q", &norm_q);
  register_module("norm_k", &norm_k);
  register_module("to_out", &to_out);
}

Tensor Flux2ParallelSelfAttention::operator()(const Tensor& x,
                                              const nn::RotaryEmbedding& rotary) const {
  // Under tensor parallelism the fused projection holds this rank's heads and MLP features.
  const int64_t ranks = to_qkv_mlp_proj.tp_degree;
  const int64_t inner = heads * head_dim / ranks, mlp_width = mlp_hidden_dim / ranks;
  const auto parts = split(to_qkv_mlp_proj(x), {inner, inner, inner, 2 * mlp_width}, 2);
  Tensor q = norm_q(unflatten_heads(parts[0], head_dim));
  Tensor k = norm_k(unflatten_heads(parts[1], head_dim));
  const Tensor v = unflatten_heads(parts[2], head_dim);
  q = apply_rope(q, rotary.cos, rotary.sin, RopeLayout::interleaved, 1, RopeMath::fp32);
  k = apply_rope(k, rotary.cos, rotary.sin, RopeLayout::interleaved, 1, RopeMath::fp32);
  Tensor out =
      scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  out = contiguous(out.transpose(1, 2)).flatten(2, 3);
  const Tensor mlp = swiglu(parts[3], /*gate_first=*/true);
  return to_out(concat({out, mlp}, 2));
}

Flux2SingleTransformerBlock::Flux2SingleTransformerBlock(int64_t dim, int64_t heads,
                                                         int64_t head_dim, int64_t mlp_hidden,
                                                         double eps)
    : norm(dim, eps, /*elementwise_affine=*/false), attn(dim, heads, head_dim, mlp_hidden, eps) {
  register_module("norm", &norm);
  register_module("attn", &attn);
}

Flux2BlockOutput Flux2SingleTransformerBlock::operator()(const Tensor& joint, const Tensor& mod,
                                                         const nn::RotaryEmbedding& rotary,
                                                         bool with_attn) const {
  const auto out = call(
      {joint, mod, rotary.cos, rotary.sin},
      [this, with_attn](const std::vector<Tensor>& in) {
        const Flux2BlockOutput o = forward_impl(in[0], in[1], nn::RotaryEmbedding{in[2], in[3]});
        std::vector<Tensor> r{o.hidden_states};
        if (with_attn) r.push_back(o.attn_hidden_states);
        return r;
      },
      with_attn ? 1 : 0);
  return {Tensor(), out[0], Tensor(), with_attn ? out[1] : Tensor()};
}

Flux2BlockOutput Flux2SingleTransformerBlock::forward_impl(
    const Tensor& joint, const Tensor& mod, const nn::RotaryEmbedding& rotary) const {
  const auto m = chunk(mod, 3, 1);  // shift, scale, gate
  const Tensor a = attn(nn::modulate(norm(joint), m[0], m[1]), rotary);
  return {Tensor(), clip_f16(joint + m[2].unsqueeze(1) * a), Tensor(), a};
}

Flux2TransformerConfig Flux2TransformerConfig::from_json(const JsonConfig& c) {
  const std::string class_name = c.get_string("_class_name", "Flux2Transformer2DModel");
  TESSERA_CHECK(class_name == "Flux2Transformer2DModel", kWhere, " unsupported _class_name '",
                class_name, "' in ", c.source(), "; expected Flux2Transformer2DModel");
  Flux2TransformerConfig cfg;
  cfg.patch_size = c.get_int("patch_size", 1);
  cfg.in_channels = c.get_int("in_channels");
  cfg.out_channels = c.get_int("out_channels", cfg.in_channels);
  cfg.num_layers = c.get_int("num_layers");
  cfg.num_single_layers = c.get_int("num_single_layers");
  cfg.attention_head_dim = c.get_int("attention_head_dim");
  cfg.num_attention_heads = c.get_int("num_attention_heads");
  cfg.joint_attention_dim = c.get_int("joint_attention_dim");
  cfg.timestep_guidance_channels = c.get_int("timestep_guidance_channels", 256);
  cfg.mlp_ratio = c.get_float("mlp_ratio", 3.0);
  cfg.axes_dims_rope = c.get_int_list("axes_dims_rope");
  cfg.rope_theta = c.get_float("rope_theta", 2000.0);
  cfg.eps = c.get_float("eps", 1e-6);
  cfg.guidance_embeds = c.get_bool("guidance_embeds", true);

  TESSERA_CHECK(cfg.patch_size == 1, kWhere, " unsupported value patch_size=", cfg.patch_size,
                " in ", c.source(), "; Flux2Pipeline packs 2x2 patches itself (patch_size 1)");
  require_positive(c, "in_channels", cfg.in_channels);
  require_positive(c, "out_channels", cfg.out_channels);
  TESSERA_CHECK(cfg.num_layers >= 0, kWhere, " unsupported value num_layers=", cfg.num_layers,
                " in ", c.source());
  TESSERA_CHECK(cfg.num_single_layers >= 0, kWhere,
                " unsupported value num_single_layers=", cfg.num_single_layers, " in ", c.source());
  require_positive(c, "attention_head_dim", cfg.attention_head_dim);
  require_positive(c, "num_attention_heads", cfg.num_attention_heads);
  require_positive(c, "joint_attention_dim", cfg.joint_attention_dim);
  require_positive(c, "timestep_guidance_channels", cfg.timestep_guidance_channels);
  TESSERA_CHECK(cfg.timestep_guidance_channels % 2 == 0, kWhere,
                " unsupported value timestep_guidance_channels=", cfg.timestep_guidance_channels,
                " in ", c.source(), "; expected an even number");
  TESSERA_CHECK(cfg.mlp_ratio > 0 && cfg.mlp_hidden_dim() > 0, kWhere,
                " unsupported value mlp_ratio=", cfg.mlp_ratio, " in ", c.source());
  TESSERA_CHECK(cfg.rope_theta > 0, kWhere, " unsupported value rope_theta=", cfg.rope_theta,
                " in ", c.source());
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

Flux2Transformer2DModel::Flux2Transformer2DModel(const Flux2TransformerConfig& cfg)
    : config(cfg),
      pos_embed(cfg.rope_theta, cfg.axes_dims_rope),
      time_guidance_embed(cfg.timestep_guidance_channels, cfg.inner_dim(), cfg.guidance_embeds),
      double_stream_modulation_img(cfg.inner_dim(), 2),
      double_stream_modulation_txt(cfg.inner_dim(), 2),
      single_stream_modulation(cfg.inner_dim(), 1),
      x_embedder(cfg.in_channels, cfg.inner_dim(), false),
      context_embedder(cfg.joint_attention_dim, cfg.inner_dim(), false),
      norm_out(cfg.inner_dim(), cfg.inner_dim(), cfg.eps, /*bias=*/false),
      proj_out(cfg.inner_dim(), cfg.patch_size * cfg.patch_size * cfg.out_channels, false) {
  const int64_t dim = cfg.inner_dim(), mlp = cfg.mlp_hidden_dim();
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    transformer_blocks.push_back(std::make_unique<Flux2TransformerBlock>(
        dim, cfg.num_attention_heads, cfg.attention_head_dim, mlp, cfg.eps));
  for (int64_t i = 0; i < cfg.num_single_layers; ++i)
    single_transformer_blocks.push_back(std::make_unique<Flux2SingleTransformerBlock>(
        dim, cfg.num_attention_heads, cfg.attention_head_dim, mlp, cfg.eps));
  register_module("time_guidance_embed", &time_guidance_embed);
  register_module("double_stream_modulation_img", &double_stream_modulation_img);
  register_module("double_stream_modulation_txt", &double_stream_modulation_txt);
  register_module("single_stream_modulation", &single_stream_modulation);
  register_module("x_embedder", &x_embedder);
  register_module("context_embedder", &context_embedder);
  register_modules("transformer_blocks", transformer_blocks);
  register_modules("single_transformer_blocks", single_transformer_blocks);
  register_module("norm_out", &norm_out);
  register_module("proj_out", &proj_out);
}

std::vector<std::string> Flux2Transformer2DModel::capture_names() const {
  std::vector<std::string> names = {"time_guidance_embed",
                                    "double_stream_modulation_img",
                                    "double_stream_modulation_txt",
                                    "single_stream_modulation",
                                    "x_embedder",
                                    "context_embedder",
                                    "pos_embed.img.cos",
                                    "pos_embed.img.sin",
                                    "pos_embed.txt.cos",
                                    "pos_embed.txt.sin"};
  for (size_t i = 0; i < transformer_blocks.size(); ++i)
    for (const char* k : {".attn.encoder_hidden_states", ".attn.hidden_states",
                          ".encoder_hidden_states", ".hidden_states"})
      names.push_back("transformer_blocks." + std::to_string(i) + k);
  for (size_t i = 0; i < single_transformer_blocks.size(); ++i)
    for (const char* k : {".attn", ""})
      names.push_back("single_transformer_blocks." + std::to_string(i) + k);
  names.push_back("norm_out");
  names.push_back("proj_out");
  return names;
}

Tensor Flux2Transformer2DModel::forward(const Flux2TransformerInputs& in,
                                        std::map<std::string, Tensor>* capture) const {
  const std::vector<std::string> names = capture ? capture_names() : std::vector<std::string>{};
  const auto outs = call(
      {in.hidden_states, in.encoder_hidden_states, in.timestep, in.img_ids, in.txt_ids,
       in.guidance},
      [&](const std::vector<Tensor>& x) {
        std::map<std::string, Tensor> cap;
        const Tensor sample =
            forward_eager({x[0], x[1], x[2], x[3], x[4], x[5]}, capture ? &cap : nullptr);
        std::vector<Tensor> r{sample};
        for (const auto& n : names) r.push_back(cap.at(n));
        return r;
      },
      capture ? 1 : 0);
  for (size_t i = 0; i < names.size(); ++i) (*capture)[names[i]] = outs[i + 1];
  return outs[0];
}

Tensor Flux2Transformer2DModel::forward_eager(const Flux2TransformerInputs& in,
                                              std::map<std::string, Tensor>* capture) const {
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[name] = t;
  };
  const Flux2TransformerConfig& c = config;
  nn::check_input_shape(kWhere, "hidden_states", in.hidden_states, {"B", "L_img", c.in_channels});
  const int64_t B = in.hidden_states.dim(0);
  nn::check_input_shape(kWhere, "encoder_hidden_states", in.encoder_hidden_states,
                        {B, "L_txt", c.joint_attention_dim});
  nn::check_input_shape(kWhere, "timestep", in.timestep, {B});
  if (in.guidance.defined()) nn::check_input_shape(kWhere, "guidance", in.guidance, {B});
  const int64_t axes = int64_t(c.axes_dims_rope.size());
  const Tensor txt_ids = unbatched_ids(in.txt_ids, "txt_ids", axes);
  const Tensor img_ids = unbatched_ids(in.img_ids, "img_ids", axes);
  TESSERA_CHECK(txt_ids.dim(0) == in.encoder_hidden_states.dim(1) &&
                    img_ids.dim(0) == in.hidden_states.dim(1),
                kWhere, " txt_ids ", txt_ids.describe(), " and img_ids ", img_ids.describe(),
                " must have one row per text and image token (", in.encoder_hidden_states.dim(1),
                " and ", in.hidden_states.dim(1), ")");

  // Activations run in the model dtype; timestep and guidance are scaled in it (as diffusers).
  const DType dt = dtype_;
  const Tensor timestep = astype(in.timestep, dt) * 1000.0;
  const Tensor guidance = in.guidance.defined() ? astype(in.guidance, dt) * 1000.0 : Tensor();
  const Tensor temb = time_guidance_embed(timestep, guidance);
  record("time_guidance_embed", temb);
  const Tensor mod_img = double_stream_modulation_img(temb);
  const Tensor mod_txt = double_stream_modulation_txt(temb);
  const Tensor mod_single = single_stream_modulation(temb);
  record("double_stream_modulation_img", mod_img);
  record("double_stream_modulation_txt", mod_txt);
  record("single_stream_modulation", mod_single);

  Tensor hidden_states = x_embedder(astype(in.hidden_states, dt));
  record("x_embedder", hidden_states);
  Tensor encoder_hidden_states = context_embedder(astype(in.encoder_hidden_states, dt));
  record("context_embedder", encoder_hidden_states);

  // Text then image rows; each row's table depends only on its ids.
  const nn::RotaryEmbedding img_rope = pos_embed(img_ids.slice(1, 0, axes));
  const nn::RotaryEmbedding txt_rope = pos_embed(txt_ids.slice(1, 0, axes));
  record("pos_embed.img.cos", img_rope.cos);
  record("pos_embed.img.sin", img_rope.sin);
  record("pos_embed.txt.cos", txt_rope.cos);
  record("pos_embed.txt.sin", txt_rope.sin);
  const nn::RotaryEmbedding rotary{concat({txt_rope.cos, img_rope.cos}, 0),
                                   concat({txt_rope.sin, img_rope.sin}, 0)};

  const bool with_attn = capture != nullptr;
  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    const auto o = (*transformer_blocks[i])(hidden_states, encoder_hidden_states, mod_img, mod_txt,
                                            rotary, with_attn);
    encoder_hidden_states = o.encoder_hidden_states;
    hidden_states = o.hidden_states;
    if (capture) {
      const std::string p = "transformer_blocks." + std::to_string(i);
      record(p + ".attn.encoder_hidden_states", o.attn_encoder_hidden_states);
      record(p + ".attn.hidden_states", o.attn_hidden_states);
      record(p + ".encoder_hidden_states", encoder_hidden_states);
      record(p + ".hidden_states", hidden_states);
    }
  }
  const int64_t text_len = encoder_hidden_states.dim(1);
  Tensor joint = concat({encoder_hidden_states, hidden_states}, 1);
  for (size_t i = 0; i < single_transformer_blocks.size(); ++i) {
    const auto o = (*single_transformer_blocks[i])(joint, mod_single, rotary, with_attn);
    joint = o.hidden_states;
    if (capture) {
      const std::string p = "single_transformer_blocks." + std::to_string(i);
      record(p + ".attn", o.attn_hidden_states);
      record(p, joint);
    }
  }
  hidden_states = joint.slice(1, text_len, joint.dim(1));

  hidden_states = norm_out(hidden_states, temb);
  record("norm_out", hidden_states);
  const Tensor sample = proj_out(hidden_states);
  record("proj_out", sample);
  return sample;
}

}  // namespace tessera
