#include "nn/joint_attention.h"

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/shape_ops.h"

namespace tessera::nn {

namespace {

// (B, L, heads * head_dim) -> (B, L, heads, head_dim); the norms act on the last dimension, so
// they commute with diffusers' transpose to (B, H, L, D).
Tensor unflatten_heads(const Tensor& x, int64_t head_dim) {
  return x.view({x.dim(0), x.dim(1), -1, head_dim});
}

Tensor maybe_norm(const std::unique_ptr<RMSNorm>& norm, const Tensor& x) {
  return norm ? (*norm)(x) : x;
}

}  // namespace

JointAttention::JointAttention(int64_t dim, int64_t h, int64_t dim_head, bool qk_rms_norm, bool ctx,
                               bool pre_only)
    : heads(h),
      head_dim(dim_head),
      context(ctx),
      context_pre_only(pre_only),
      to_q(dim, h * dim_head),
      to_k(dim, h * dim_head),
      to_v(dim, h * dim_head),
      to_out_0(h * dim_head, dim) {
  const int64_t inner = h * dim_head;
  register_module("to_q", &to_q);
  register_module("to_k", &to_k);
  register_module("to_v", &to_v);
  if (qk_rms_norm) {
    norm_q = std::make_unique<RMSNorm>(dim_head, 1e-6);
    norm_k = std::make_unique<RMSNorm>(dim_head, 1e-6);
    register_module("norm_q", norm_q.get());
    register_module("norm_k", norm_k.get());
  }
  register_module("to_out.0", &to_out_0);
  if (!context) return;
  add_q_proj = std::make_unique<Linear>(dim, inner);
  add_k_proj = std::make_unique<Linear>(dim, inner);
  add_v_proj = std::make_unique<Linear>(dim, inner);
  register_module("add_q_proj", add_q_proj.get());
  register_module("add_k_proj", add_k_proj.get());
  register_module("add_v_proj", add_v_proj.get());
  if (qk_rms_norm) {
    norm_added_q = std::make_unique<RMSNorm>(dim_head, 1e-6);
    norm_added_k = std::make_unique<RMSNorm>(dim_head, 1e-6);
    register_module("norm_added_q", norm_added_q.get());
    register_module("norm_added_k", norm_added_k.get());
  }
  if (!context_pre_only) {
    to_add_out = std::make_unique<Linear>(inner, dim);
    register_module("to_add_out", to_add_out.get());
  }
}

JointAttention::Output JointAttention::operator()(const Tensor& hidden_states,
                                                  const Tensor& encoder_hidden_states) const {
  Tensor q = maybe_norm(norm_q, unflatten_heads(to_q(hidden_states), head_dim));
  Tensor k = maybe_norm(norm_k, unflatten_heads(to_k(hidden_states), head_dim));
  Tensor v = unflatten_heads(to_v(hidden_states), head_dim);
  const bool joint = context && encoder_hidden_states.defined();
  const int64_t image_len = hidden_states.dim(1);
  if (joint) {
    Tensor eq =
        maybe_norm(norm_added_q, unflatten_heads((*add_q_proj)(encoder_hidden_states), head_dim));
    Tensor ek =
        maybe_norm(norm_added_k, unflatten_heads((*add_k_proj)(encoder_hidden_states), head_dim));
    Tensor ev = unflatten_heads((*add_v_proj)(encoder_hidden_states), head_dim);
    q = concat({q, eq}, 1);  // [image, context], as JointAttnProcessor2_0
    k = concat({k, ek}, 1);
    v = concat({v, ev}, 1);
  }
  Tensor out =
      scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  out = contiguous(out.transpose(1, 2)).flatten(2, 3);  // (B, S, H * D)
  if (!joint) return {to_out_0(out), Tensor()};
  auto parts = split(out, {image_len, out.dim(1) - image_len}, 1);
  return {to_out_0(parts[0]), to_add_out ? (*to_add_out)(parts[1]) : parts[1]};
}

}  // namespace tessera::nn
