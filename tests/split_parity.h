// For the tests that compare a split model with the whole one (CPU ranks, XLA devices): seeded
// FLUX.1 inputs, a 4-head config, seeded random weights, and the bounds they check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "io/png.h"
#include "models/flux_transformer.h"
#include "nn/module.h"
#include "runtime/random.h"

namespace tessera::test {

// max |a - e| / max |e|: "within 1e-5 relative" for a whole activation.
inline double relative_error(const Tensor& a, const Tensor& e) {
  const auto av = a.to_floats(), ev = e.to_floats();
  EXPECT_EQ(av.size(), ev.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < av.size() && i < ev.size(); ++i) {
    diff = std::max(diff, double(std::fabs(av[i] - ev[i])));
    scale = std::max(scale, double(std::fabs(ev[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// forward() arguments at a 32x32 image (16 latent tokens) and 8 text tokens: torch.randn draws
// from one seed, so every rank (and every device count) gets the same.
inline FluxTransformerInputs seeded_flux_inputs(const FluxTransformerConfig& c) {
  Generator gen(7);
  FluxTransformerInputs in;
  const int64_t img = 16, txt = 8;
  in.hidden_states = randn({1, img, c.in_channels}, DType::f32, gen);
  in.encoder_hidden_states = randn({1, txt, c.joint_attention_dim}, DType::f32, gen);
  in.pooled_projections = randn({1, c.pooled_projection_dim}, DType::f32, gen);
  in.timestep = Tensor::from_floats({0.75f}, {1});
  if (c.guidance_embeds) in.guidance = Tensor::from_floats({3.5f}, {1});
  std::vector<float> img_ids, txt_ids(size_t(txt * 3), 0.0f);
  for (int64_t i = 0; i < img; ++i) img_ids.insert(img_ids.end(), {0.0f, float(i / 4), float(i % 4)});
  in.img_ids = Tensor::from_floats(img_ids, {img, 3});
  in.txt_ids = Tensor::from_floats(txt_ids, {txt, 3});
  return in;
}

// A FLUX.1 transformer of 4 heads (the fixtures have 2), 2 + 2 blocks: splits 2 and 4 ways.
inline FluxTransformerConfig four_head_flux_config() {
  FluxTransformerConfig c;
  c.in_channels = c.out_channels = 16;
  c.num_layers = 2;
  c.num_single_layers = 2;
  c.attention_head_dim = 8;
  c.num_attention_heads = 4;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 12;
  c.guidance_embeds = true;
  c.axes_dims_rope = {2, 2, 4};
  return c;
}

// torch.randn weights for every parameter of `model` (full shapes, in named_parameters order)
// times `scale`: the same on every rank and device count.
inline std::map<std::string, Tensor> seeded_weights(const Module& model, uint64_t seed,
                                                    double scale) {
  Generator gen(seed);
  std::map<std::string, Tensor> weights;
  for (const auto& p : model.named_parameters())
    weights[p.name] = randn(p.full_shape, DType::f32, gen) * scale;
  return weights;
}

// Two PNGs of one picture, the second from a split model: its partial sums add up in another
// order (f32 within 1e-5), which can move a value across a rounding boundary of x * 255, so at
// most one level on at most 0.1% of the values. Returns how many values differ (0 after a size
// mismatch, which fails here).
struct PictureDiff {
  size_t differ = 0, values = 0;
};
inline PictureDiff expect_same_picture(const std::string& one, const std::string& two,
                                       const std::string& what) {
  const PngImage pa = read_png(one), pb = read_png(two);
  EXPECT_EQ(pa.rgb.size(), pb.rgb.size()) << what;
  if (pa.rgb.size() != pb.rgb.size()) return {};
  PictureDiff r{0, pa.rgb.size()};
  int worst = 0;
  for (size_t i = 0; i < pa.rgb.size(); ++i) {
    const int d = std::abs(int(pa.rgb[i]) - int(pb.rgb[i]));
    r.differ += d != 0;
    worst = std::max(worst, d);
  }
  EXPECT_LE(worst, 1) << what;
  EXPECT_LE(double(r.differ), 1e-3 * double(r.values)) << what;
  return r;
}

}  // namespace tessera::test
