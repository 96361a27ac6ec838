// diffusers' normalization layers (models/normalization.py) built on nn/layers.h's LayerNorm and
// RMSNorm: the adaptive (timestep-modulated) LayerNorms of the MMDiT transformers, and
// torch.nn.RMSNorm as FLUX's attention uses it for qk-norm.
#pragma once
#include <cstdint>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::nn {

// x * (1 + scale[:, None]) + shift[:, None], one rounding per op as torch.
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale);

// torch.nn.RMSNorm(dim, eps): unlike diffusers' RMSNorm, torch multiplies by the weight in fp32
// and rounds once (checked on torch's CPU kernel), so the weight is applied as f32.
class TorchRMSNorm : public Module {
 public:
  TorchRMSNorm(int64_t dim, double eps);
  Tensor operator()(const Tensor& x) const;
  double eps;
  Tensor weight;
};

// AdaLayerNormZero(dim): linear(silu(emb)) -> 6 chunks; LayerNorm(eps 1e-6, no affine) modulated.
class AdaLayerNormZero : public Module {
 public:
  explicit AdaLayerNormZero(int64_t embedding_dim);
  struct Output {
    Tensor x, gate_msa, shift_mlp, scale_mlp, gate_mlp;
  };
  Output operator()(const Tensor& x, const Tensor& emb) const;
  Linear linear;
  LayerNorm norm;
};

// AdaLayerNormZeroSingle(dim): 3 chunks (shift, scale, gate).
class AdaLayerNormZeroSingle : public Module {
 public:
  explicit AdaLayerNormZeroSingle(int64_t embedding_dim);
  struct Output {
    Tensor x, gate_msa;
  };
  Output operator()(const Tensor& x, const Tensor& emb) const;
  Linear linear;
  LayerNorm norm;
};

// AdaLayerNormContinuous(dim, cond_dim, elementwise_affine=False, eps): chunks in the order
// (scale, shift), unlike AdaLayerNormZero.
class AdaLayerNormContinuous : public Module {
 public:
  // bias=false: the linear has no bias (FLUX.2).
  AdaLayerNormContinuous(int64_t embedding_dim, int64_t conditioning_embedding_dim, double eps,
                         bool bias = true);
  Tensor operator()(const Tensor& x, const Tensor& conditioning_embedding) const;
  Linear linear;
  LayerNorm norm;
};

// SD35AdaLayerNormZeroX(dim): AdaLayerNormZero's six chunks plus (shift, scale, gate) of the
// dual-attention blocks' image-only attention, both modulating the same LayerNorm.
class SD35AdaLayerNormZeroX : public Module {
 public:
  explicit SD35AdaLayerNormZeroX(int64_t embedding_dim);
  struct Output {
    Tensor x, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_hidden_states2, gate_msa2;
  };
  Output operator()(const Tensor& x, const Tensor& emb) const;
  Linear linear;
  LayerNorm norm;
};

}  // namespace tessera::nn
