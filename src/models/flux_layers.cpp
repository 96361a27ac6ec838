#include "models/flux_layers.h"

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera::flux {

namespace {

// x * (1 + scale[:, None]) + shift[:, None], one rounding per op as torch.
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return x * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1);
}

// (B, L, heads * head_dim) -> (B, L, heads, head_dim).
Tensor unflatten_heads(const Tensor& x, int64_t head_dim) {
  return x.view({x.dim(0), x.dim(1), -1, head_dim});
}

}  // namespace

RotaryEmbedding FluxPosEmbed::operator()(const Tensor& ids) const {
  TESSERA_CHECK(ids.ndim() == 2 && ids.dim(1) == int64_t(axes_dim.size()), "[FluxPosEmbed] ids ",
                ids.describe(), " must be (L, ", axes_dim.size(), "), one column per rope axis");
  auto [cos, sin] = rope_frequencies(ids, axes_dim, theta);
  return {cos, sin};
}

TimestepEmbedding::TimestepEmbedding(int64_t in_channels, int64_t time_embed_dim)
    : linear_1(in_channels, time_embed_dim), linear_2(time_embed_dim, time_embed_dim) {
  register_module("linear_1", &linear_1);
  register_module("linear_2", &linear_2);
}

Tensor TimestepEmbedding::operator()(const Tensor& sample) const {
  return linear_2(silu(linear_1(sample)));
}

PixArtAlphaTextProjection::PixArtAlphaTextProjection(int64_t in_features, int64_t hidden_size)
    : linear_1(in_features, hidden_size), linear_2(hidden_size, hidden_size) {
  register_module("linear_1", &linear_1);
  register_module("linear_2", &linear_2);
}

Tensor PixArtAlphaTextProjection::operator()(const Tensor& caption) const {
  return linear_2(silu(linear_1(caption)));
}

CombinedTimestepTextProjEmbeddings::CombinedTimestepTextProjEmbeddings(
    int64_t embedding_dim, int64_t pooled_projection_dim, bool guidance)
    : guidance_embeds(guidance),
      timestep_embedder(256, embedding_dim),
      text_embedder(pooled_projection_dim, embedding_dim) {
  register_module("timestep_embedder", &timestep_embedder);
  if (guidance_embeds) {
    guidance_embedder = std::make_unique<TimestepEmbedding>(256, embedding_dim);
    register_module("guidance_embedder", guidance_embedder.get());
  }
  register_module("text_embedder", &text_embedder);
}

Tensor CombinedTimestepTextProjEmbeddings::operator()(const Tensor& timestep,
                                                      const Tensor& guidance,
                                                      const Tensor& pooled_projection) const {
  // Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) computes in fp32; diffusers then
  // casts the projection to the pooled projection's dtype.
  const DType dt = pooled_projection.dtype();
  Tensor emb = timestep_embedder(astype(timestep_embedding(timestep, 256, true, 0.0), dt));
  if (guidance_embeds) {
    TESSERA_CHECK(guidance.defined(),
                  "[CombinedTimestepGuidanceTextProjEmbeddings] guidance is required");
    emb = emb + (*guidance_embedder)(astype(timestep_embedding(guidance, 256, true, 0.0), dt));
  }
  return emb + text_embedder(pooled_projection);
}

AdaLayerNormZero::AdaLayerNormZero(int64_t dim)
    : linear(dim, 6 * dim), norm(dim, 1e-6, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

AdaLayerNormZero::Output AdaLayerNormZero::operator()(const Tensor& x, const Tensor& emb) const {
  auto c = chunk(linear(silu(emb)), 6, 1);  // shift, scale, gate (msa), shift, scale, gate (mlp)
  return {modulate(norm(x), c[0], c[1]), c[2], c[3], c[4], c[5]};
}

AdaLayerNormZeroSingle::AdaLayerNormZeroSingle(int64_t dim)
    : linear(dim, 3 * dim), norm(dim, 1e-6, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

AdaLayerNormZeroSingle::Output AdaLayerNormZeroSingle::operator()(const Tensor& x,
                                                                  const Tensor& emb) const {
  auto c = chunk(linear(silu(emb)), 3, 1);  // shift, scale, gate
  return {modulate(norm(x), c[0], c[1]), c[2]};
}

AdaLayerNormContinuous::AdaLayerNormContinuous(int64_t dim, int64_t cond_dim, double eps)
    : linear(cond_dim, 2 * dim), norm(dim, eps, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

Tensor AdaLayerNormContinuous::operator()(const Tensor& x, const Tensor& cond) const {
  auto c = chunk(linear(astype(silu(cond), x.dtype())), 2, 1);  // scale, shift (this order)
  return modulate(norm(x), c[1], c[0]);
}

GeluProjection::GeluProjection(int64_t dim_in, int64_t dim_out) : proj(dim_in, dim_out) {
  register_module("proj", &proj);
}

Tensor GeluProjection::operator()(const Tensor& x) const {
  return gelu(proj(x), true);
}

FeedForward::FeedForward(int64_t dim, int64_t dim_out, int64_t mult)
    : act(dim, dim * mult), out(dim * mult, dim_out) {
  register_module("net.0", &act);
  register_module("net.2", &out);
}

Tensor FeedForward::operator()(const Tensor& x) const {
  return out(act(x));
}

TorchRMSNorm::TorchRMSNorm(int64_t dim, double e) : eps(e) {
  register_parameter("weight", &weight, {dim});
}

Tensor TorchRMSNorm::operator()(const Tensor& x) const {
  // rms_norm with an f32 weight keeps h in fp32 and returns f32; round once to x's dtype.
  return astype(rms_norm(x, astype(weight, DType::f32), eps), x.dtype());
}

FluxAttention::FluxAttention(int64_t query_dim, int64_t h, int64_t dim_head, bool added, bool pre,
                             double eps)
    : heads(h),
      head_dim(dim_head),
      added_kv_proj(added),
      pre_only(pre),
      norm_q(dim_head, eps),
      norm_k(dim_head, eps),
      to_q(query_dim, h * dim_head),
      to_k(query_dim, h * dim_head),
      to_v(query_dim, h * dim_head) {
  const int64_t inner = h * dim_head;
  register_module("norm_q", &norm_q);
  register_module("norm_k", &norm_k);
  register_module("to_q", &to_q);
  register_module("to_k", &to_k);
  register_module("to_v", &to_v);
  if (!pre_only) {
    to_out_0 = std::make_unique<nn::Linear>(inner, query_dim);
    register_module("to_out.0", to_out_0.get());
  }
  if (added_kv_proj) {
    norm_added_q = std::make_unique<TorchRMSNorm>(dim_head, eps);
    norm_added_k = std::make_unique<TorchRMSNorm>(dim_head, eps);
    add_q_proj = std::make_unique<nn::Linear>(query_dim, inner);
    add_k_proj = std::make_unique<nn::Linear>(query_dim, inner);
    add_v_proj = std::make_unique<nn::Linear>(query_dim, inner);
    to_add_out = std::make_unique<nn::Linear>(inner, query_dim);
    register_module("norm_added_q", norm_added_q.get());
    register_module("norm_added_k", norm_added_k.get());
    register_module("add_q_proj", add_q_proj.get());
    register_module("add_k_proj", add_k_proj.get());
    register_module("add_v_proj", add_v_proj.get());
    register_module("to_add_out", to_add_out.get());
  }
}

FluxAttention::Output FluxAttention::operator()(const Tensor& hidden_states,
                                                const Tensor& encoder_hidden_states,
                                                const RotaryEmbedding* rotary) const {
  // (B, S, H, D) throughout, as FluxAttnProcessor; SDPA sees (B, H, S, D) views.
  Tensor q = norm_q(unflatten_heads(to_q(hidden_states), head_dim));
  Tensor k = norm_k(unflatten_heads(to_k(hidden_states), head_dim));
  Tensor v = unflatten_heads(to_v(hidden_states), head_dim);
  const bool joint = added_kv_proj && encoder_hidden_states.defined();
  int64_t text_len = 0;
  if (joint) {
    text_len = encoder_hidden_states.dim(1);
    Tensor eq = (*norm_added_q)(unflatten_heads((*add_q_proj)(encoder_hidden_states), head_dim));
    Tensor ek = (*norm_added_k)(unflatten_heads((*add_k_proj)(encoder_hidden_states), head_dim));
    Tensor ev = unflatten_heads((*add_v_proj)(encoder_hidden_states), head_dim);
    q = concat({eq, q}, 1);
    k = concat({ek, k}, 1);
    v = concat({ev, v}, 1);
  }
  if (rotary) {
    q = apply_rope(q, rotary->cos, rotary->sin, RopeLayout::interleaved, 1, RopeMath::fp32);
    k = apply_rope(k, rotary->cos, rotary->sin, RopeLayout::interleaved, 1, RopeMath::fp32);
  }
  Tensor out =
      scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  out = contiguous(out.transpose(1, 2)).flatten(2, 3);  // (B, S, H * D)
  if (!joint) return {pre_only ? out : (*to_out_0)(out), Tensor()};
  auto parts = split(out, {text_len, out.dim(1) - text_len}, 1);
  return {(*to_out_0)(parts[1]), (*to_add_out)(parts[0])};
}

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

namespace {
// diffusers clips fp16 residual streams to the finite range.
Tensor clip_f16(const Tensor& x) {
  if (x.dtype() != DType::f16) return x;
  return minimum(maximum(x, -65504.0), 65504.0);
}
}  // namespace

BlockOutput FluxTransformerBlock::operator()(const Tensor& hidden_states,
                                             const Tensor& encoder_hidden_states,
                                             const Tensor& temb,
                                             const RotaryEmbedding& rotary) const {
  // Regional compilation routes every layer through its class's program (weights as inputs).
  const auto out = call_compiled(
      {hidden_states, encoder_hidden_states, temb, rotary.cos, rotary.sin},
      [this](const std::vector<Tensor>& in) {
        const BlockOutput o = forward_impl(in[0], in[1], in[2], RotaryEmbedding{in[3], in[4]});
        return std::vector<Tensor>{o.encoder_hidden_states, o.hidden_states};
      });
  return {out[0], out[1]};
}

BlockOutput FluxTransformerBlock::forward_impl(const Tensor& hidden_states,
                                               const Tensor& encoder_hidden_states,
                                               const Tensor& temb,
                                               const RotaryEmbedding& rotary) const {
  auto n = norm1(hidden_states, temb);
  auto nc = norm1_context(encoder_hidden_states, temb);
  auto a = attn(n.x, nc.x, &rotary);

  Tensor hs = hidden_states + n.gate_msa.unsqueeze(1) * a.hidden_states;
  Tensor ff_out = ff(modulate(norm2(hs), n.shift_mlp, n.scale_mlp));
  hs = hs + n.gate_mlp.unsqueeze(1) * ff_out;

  Tensor enc = encoder_hidden_states + nc.gate_msa.unsqueeze(1) * a.encoder_hidden_states;
  Tensor ctx_ff_out = ff_context(modulate(norm2_context(enc), nc.shift_mlp, nc.scale_mlp));
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

BlockOutput FluxSingleTransformerBlock::operator()(const Tensor& hidden_states,
                                                   const Tensor& encoder_hidden_states,
                                                   const Tensor& temb,
                                                   const RotaryEmbedding& rotary) const {
  const int64_t text_len = encoder_hidden_states.dim(1);
  const Tensor hs = forward_joint(concat({encoder_hidden_states, hidden_states}, 1), temb, rotary);
  return {hs.slice(1, 0, text_len), hs.slice(1, text_len, hs.dim(1))};
}

Tensor FluxSingleTransformerBlock::forward_joint(const Tensor& residual, const Tensor& temb,
                                                 const RotaryEmbedding& rotary) const {
  return call_compiled(
      {residual, temb, rotary.cos, rotary.sin}, [this](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{forward_joint_impl(in[0], in[1], RotaryEmbedding{in[2], in[3]})};
      })[0];
}

Tensor FluxSingleTransformerBlock::forward_joint_impl(const Tensor& residual, const Tensor& temb,
                                                      const RotaryEmbedding& rotary) const {
  auto n = norm(residual, temb);
  Tensor mlp = gelu(proj_mlp(n.x), true);
  Tensor attn_out = attn(n.x, Tensor(), &rotary).hidden_states;
  Tensor hs = n.gate_msa.unsqueeze(1) * proj_out(concat({attn_out, mlp}, 2));
  return clip_f16(residual + hs);
}

}  // namespace tessera::flux
