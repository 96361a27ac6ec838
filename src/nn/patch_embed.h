// diffusers' PatchEmbed (models/embeddings.py) as SD3 configures it: a patch_size-stride conv to
// tokens plus a 2-D sin-cos position table of pos_embed_max_size^2 positions, cropped at the
// centre to the latent's patch grid.
#pragma once
#include <cstdint>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::nn {

// get_2d_sincos_pos_embed(embed_dim, grid_size, base_size, interpolation_scale=1): (grid^2, D)
// f32. Positions in f32, frequencies and sin/cos in f64 as diffusers; the first D/2 channels
// encode the column, the last D/2 the row (diffusers' meshgrid order).
Tensor sincos_pos_embed_2d(int64_t embed_dim, int64_t grid_size, int64_t base_size);

class PatchEmbed : public Module {
 public:
  // PatchEmbed(height=width=sample_size, patch_size, in_channels, embed_dim, pos_embed_max_size).
  PatchEmbed(int64_t sample_size, int64_t patch_size, int64_t in_channels, int64_t embed_dim,
             int64_t pos_embed_max_size);
  // latent (B, C, H, W) -> (B, H/p * W/p, D) in the latent's dtype, position table added.
  Tensor operator()(const Tensor& latent) const;
  // The table's centre crop for an (h, w) patch grid: (1, h * w, D).
  Tensor cropped_pos_embed(int64_t h, int64_t w, const Device& device = Device::cpu()) const;

  int64_t patch_size, embed_dim, pos_embed_max_size, base_size;
  Conv2d proj;
  // The persistent buffer diffusers saves ("pos_embed.pos_embed", (1, M*M, D)); computed once
  // when a checkpoint lacks it.
  Tensor pos_embed;

 private:
  mutable Tensor computed_;
};

}  // namespace tessera::nn
