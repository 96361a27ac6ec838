// SD3's joint attention: diffusers' Attention module with JointAttnProcessor2_0
// (models/attention_processor.py). The image stream's q/k/v and, when the block has a context
// stream, the context's add_{q,k,v}_proj attend jointly over [image, context] (image first,
// unlike FLUX); qk-norm is diffusers' RMSNorm per head. Without a context it is plain
// self-attention (the image-only attn2 of SD3.5's dual-attention blocks).
#pragma once
#include <cstdint>
#include <memory>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::nn {

class JointAttention : public Module {
 public:
  // Attention(query_dim=dim, heads, dim_head, qk_norm, eps=1e-6, bias=True) with
  // added_kv_proj_dim=dim when `context` (then context_pre_only drops to_add_out: the last SD3
  // block returns the context's attention output unprojected, and nobody reads it further).
  JointAttention(int64_t dim, int64_t heads, int64_t dim_head, bool qk_rms_norm, bool context,
                 bool context_pre_only);
  struct Output {
    Tensor hidden_states;          // to_out.0 of the image part
    Tensor encoder_hidden_states;  // to_add_out of the context part (raw when context_pre_only)
  };
  // hidden_states (B, L, dim); encoder_hidden_states (B, T, dim) only with a context stream.
  Output operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states) const;

  int64_t heads, head_dim;
  bool context, context_pre_only;
  Linear to_q, to_k, to_v, to_out_0;
  std::unique_ptr<RMSNorm> norm_q, norm_k, norm_added_q, norm_added_k;  // qk_norm="rms_norm"
  std::unique_ptr<Linear> add_q_proj, add_k_proj, add_v_proj, to_add_out;
};

}  // namespace tessera::nn
