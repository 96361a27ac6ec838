// diffusers' embeddings (models/embeddings.py): sinusoidal timesteps, the timestep MLP, the pooled
// text projection, their combinations, and FluxPosEmbed's rotary tables.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::nn {

// FluxPosEmbed's output: f32 (L, head_dim) tables, each frequency repeated twice (interleaved).
struct RotaryEmbedding {
  Tensor cos, sin;
};

// FluxPosEmbed(theta, axes_dim): per-axis frequencies in float64, cos/sin rounded to f32.
class FluxPosEmbed {
 public:
  FluxPosEmbed(double theta, std::vector<int64_t> axes_dim)
      : theta(theta), axes_dim(std::move(axes_dim)) {}
  // ids (L, n_axes) with n_axes == axes_dim.size().
  RotaryEmbedding operator()(const Tensor& ids) const;
  double theta;
  std::vector<int64_t> axes_dim;
};

// Timesteps(num_channels, flip_sin_to_cos, downscale_freq_shift): the sinusoidal projection,
// computed in fp32 (no parameters).
struct Timesteps {
  int64_t num_channels;
  bool flip_sin_to_cos;
  double downscale_freq_shift;
  Tensor operator()(const Tensor& timesteps) const;
};

// TimestepEmbedding(in_channels, time_embed_dim) with SiLU: linear_1 -> silu -> linear_2.
class TimestepEmbedding : public Module {
 public:
  // bias=false: sample_proj_bias=False (FLUX.2).
  TimestepEmbedding(int64_t in_channels, int64_t time_embed_dim, bool bias = true);
  Tensor operator()(const Tensor& sample) const;
  Linear linear_1, linear_2;
};

// PixArtAlphaTextProjection(in_features, hidden_size, act_fn="silu").
class PixArtAlphaTextProjection : public Module {
 public:
  PixArtAlphaTextProjection(int64_t in_features, int64_t hidden_size);
  Tensor operator()(const Tensor& caption) const;
  Linear linear_1, linear_2;
};

// CombinedTimestepTextProjEmbeddings (SD3, FLUX.1-schnell), or
// CombinedTimestepGuidanceTextProjEmbeddings when `guidance_embeds` (FLUX.1-dev):
// Timesteps(256, flip_sin_to_cos=True, shift 0) -> MLPs, plus the pooled text projection.
class CombinedTimestepTextProjEmbeddings : public Module {
 public:
  CombinedTimestepTextProjEmbeddings(int64_t embedding_dim, int64_t pooled_projection_dim,
                                     bool guidance_embeds);
  // timestep/guidance (B,) already scaled by 1000; guidance only with guidance_embeds.
  Tensor operator()(const Tensor& timestep, const Tensor& guidance,
                    const Tensor& pooled_projection) const;
  bool guidance_embeds;
  Timesteps time_proj{256, true, 0.0};
  TimestepEmbedding timestep_embedder;
  std::unique_ptr<TimestepEmbedding> guidance_embedder;  // null without guidance_embeds
  PixArtAlphaTextProjection text_embedder;
};

}  // namespace tessera::nn
