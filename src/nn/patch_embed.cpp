#include "nn/patch_embed.h"

#include <cmath>
#include <vector>

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "runtime/error.h"

namespace tessera::nn {

Tensor sincos_pos_embed_2d(int64_t embed_dim, int64_t grid_size, int64_t base_size) {
  TESSERA_CHECK(embed_dim % 4 == 0, "[PatchEmbed] embed_dim ", embed_dim,
                " must be divisible by 4 for the 2-D sin-cos table");
  const int64_t half = embed_dim / 2, quarter = embed_dim / 4;
  // torch.arange(n, float32) / (n / base_size): the divisor is rounded to f32 first.
  const float step = float(double(grid_size) / double(base_size));
  std::vector<double> omega(static_cast<size_t>(quarter));
  for (int64_t k = 0; k < quarter; ++k)
    omega[size_t(k)] = 1.0 / std::pow(10000.0, double(k) / (double(half) / 2.0));
  std::vector<float> table(size_t(grid_size * grid_size * embed_dim));
  auto encode = [&](float pos, float* out) {  // [sin(pos*w), cos(pos*w)], D/2 values
    for (int64_t k = 0; k < quarter; ++k) {
      const double a = double(pos) * omega[size_t(k)];
      out[k] = float(std::sin(a));
      out[quarter + k] = float(std::cos(a));
    }
  };
  for (int64_t i = 0; i < grid_size; ++i)
    for (int64_t j = 0; j < grid_size; ++j) {
      float* row = table.data() + (i * grid_size + j) * embed_dim;
      encode(float(j) / step, row);         // column first
      encode(float(i) / step, row + half);  // then row
    }
  return Tensor::from_floats(table, {grid_size * grid_size, embed_dim});
}

PatchEmbed::PatchEmbed(int64_t sample_size, int64_t p, int64_t in_channels, int64_t dim,
                       int64_t max_size)
    : patch_size(p),
      embed_dim(dim),
      pos_embed_max_size(max_size),
      base_size(sample_size / p),
      proj(in_channels, dim, p, p) {
  register_module("proj", &proj);
  register_parameter("pos_embed", &pos_embed, {1, max_size * max_size, dim}, /*optional=*/true);
}

Tensor PatchEmbed::cropped_pos_embed(int64_t h, int64_t w, const Device& device) const {
  const int64_t m = pos_embed_max_size;
  TESSERA_CHECK(h <= m && w <= m, "[PatchEmbed] a latent of ", h, "x", w,
                " patches is larger than pos_embed_max_size ", m, " (at most ", m * patch_size,
                " latent pixels a side)");
  Tensor table = pos_embed;
  if (!table.defined()) {
    if (!computed_.defined())
      computed_ = sincos_pos_embed_2d(embed_dim, m, base_size).view({1, m * m, embed_dim});
    // The computed table is host data: moved (once per device) before any traced op reads it.
    if (computed_.device() != device) computed_ = computed_.to(device);
    table = computed_;
  }
  const int64_t top = (m - h) / 2, left = (m - w) / 2;
  return contiguous(
             table.view({1, m, m, embed_dim}).slice(1, top, top + h).slice(2, left, left + w))
      .view({1, h * w, embed_dim});
}

Tensor PatchEmbed::operator()(const Tensor& latent) const {
  const int64_t h = latent.dim(2) / patch_size, w = latent.dim(3) / patch_size;
  Tensor x = proj(latent).flatten(2).transpose(1, 2);  // BCHW -> BNC
  Tensor pos = cropped_pos_embed(h, w, latent.device());
  if (pos.dtype() != x.dtype()) pos = astype(pos, x.dtype());
  return contiguous(astype(x + pos, latent.dtype()));
}

}  // namespace tessera::nn
