// Random FluxTransformer2DModel inputs for the benchmarks (seeded, so every run and every mode
// sees the same step): latents/text of one image at height x width, timestep 1, guidance 3.5.
#pragma once
#include "models/flux_transformer.h"
#include "ops/copy.h"
#include "pipelines/flux_pipeline.h"
#include "runtime/random.h"

namespace tessera::bench {

inline FluxTransformerInputs random_flux_inputs(const FluxTransformerConfig& c, int64_t height,
                                                int64_t width, int64_t txt, DType dtype) {
  const int64_t h = height / 16, w = width / 16, img = h * w;
  Generator g(0);
  auto draw = [&](Shape shape) {
    Tensor t = randn(shape, DType::f32, g);
    return dtype == DType::f32 ? t : astype(t, dtype);
  };
  FluxTransformerInputs in;
  in.hidden_states = draw({1, img, c.in_channels});
  in.encoder_hidden_states = draw({1, txt, c.joint_attention_dim});
  in.pooled_projections = draw({1, c.pooled_projection_dim});
  in.timestep = Tensor::from_floats({1.0f}, {1}, dtype);
  if (c.guidance_embeds) in.guidance = Tensor::from_floats({3.5f}, {1}, DType::f32);
  in.img_ids = FluxPipeline::latent_image_ids(h, w, DType::f32);
  in.txt_ids = Tensor::zeros({txt, 3}, DType::f32);
  return in;
}

}  // namespace tessera::bench
