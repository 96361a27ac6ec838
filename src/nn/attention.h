// diffusers' Attention module (models/attention_processor.py; FluxAttention in transformer_flux.py)
// with its processor: q/k/v projections, per-head qk-norm, optional RoPE, SDPA, output
// projection; with the added (context) projections it is the joint attention of MMDiT blocks.
#pragma once
#include <cstdint>
#include <memory>

#include "nn/embeddings.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/normalization.h"

namespace tessera::nn {

// Attention(query_dim, heads, dim_head, qk_norm="rms_norm" (torch.nn.RMSNorm), bias=True).
// `added_kv_proj`: the context stream's add_{q,k,v}_proj, norm_added_{q,k} and to_add_out (joint
// attention over [context, hidden], as FluxAttnProcessor orders it). `pre_only`: no to_out
// (FLUX's single-stream blocks project outside).
class Attention : public Module {
 public:
  // bias=false: no projection biases (FLUX.2's Flux2Attention).
  Attention(int64_t query_dim, int64_t heads, int64_t dim_head, bool added_kv_proj, bool pre_only,
            double eps, bool bias = true);
  struct Output {
    Tensor hidden_states, encoder_hidden_states;  // the second only with added projections
  };
  // The processor. hidden_states (B, L, D); encoder_hidden_states (B, T, D) only with added
  // projections: the joint sequence is [text, image].
  Output operator()(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                    const RotaryEmbedding* rotary) const;

  int64_t heads, head_dim;
  bool added_kv_proj, pre_only;
  TorchRMSNorm norm_q, norm_k;
  Linear to_q, to_k, to_v;
  std::unique_ptr<Linear> to_out_0;
  std::unique_ptr<TorchRMSNorm> norm_added_q, norm_added_k;
  std::unique_ptr<Linear> add_q_proj, add_k_proj, add_v_proj, to_add_out;
};

}  // namespace tessera::nn
