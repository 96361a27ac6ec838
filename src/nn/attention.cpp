#include "nn/attention.h"

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"

namespace tessera::nn {

namespace {

// (B, L, heads * head_dim) -> (B, L, heads, head_dim).
Tensor unflatten_heads(const Tensor& x, int64_t head_dim) {
  return x.view({x.dim(0), x.dim(1), -1, head_dim});
}

}  // namespace

Attention::Attention(int64_t query_dim, int64_t h, int64_t dim_head, bool added, bool pre,
                     double eps, bool bias)
    : heads(h),
      head_dim(dim_head),
      added_kv_proj(added),
      pre_only(pre),
      norm_q(dim_head, eps),
      norm_k(dim_head, eps),
      to_q(query_dim, h * dim_head, bias),
      to_k(query_dim, h * dim_head, bias),
      to_v(query_dim, h * dim_head, bias) {
  const int64_t inner = h * dim_head;
  register_module("norm_q", &norm_q);
  register_module("norm_k", &norm_k);
  register_module("to_q", &to_q);
  register_module("to_k", &to_k);
  register_module("to_v", &to_v);
  if (!pre_only) {
    to_out_0 = std::make_unique<Linear>(inner, query_dim, bias);
    register_module("to_out.0", to_out_0.get());
  }
  if (added_kv_proj) {
    norm_added_q = std::make_unique<TorchRMSNorm>(dim_head, eps);
    norm_added_k = std::make_unique<TorchRMSNorm>(dim_head, eps);
    add_q_proj = std::make_unique<Linear>(query_dim, inner, bias);
    add_k_proj = std::make_unique<Linear>(query_dim, inner, bias);
    add_v_proj = std::make_unique<Linear>(query_dim, inner, bias);
    to_add_out = std::make_unique<Linear>(inner, query_dim, bias);
    register_module("norm_added_q", norm_added_q.get());
    register_module("norm_added_k", norm_added_k.get());
    register_module("add_q_proj", add_q_proj.get());
    register_module("add_k_proj", add_k_proj.get());
    register_module("add_v_proj", add_v_proj.get());
    register_module("to_add_out", to_add_out.get());
  }
}

Attention::Output Attention::operator()(const Tensor& hidden_states,
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

}  // namespace tessera::nn
