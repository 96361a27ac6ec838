#include "nn/embeddings.h"

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rope.h"
#include "runtime/error.h"

namespace tessera::nn {

RotaryEmbedding FluxPosEmbed::operator()(const Tensor& ids) const {
  TESSERA_CHECK(ids.ndim() == 2 && ids.dim(1) == int64_t(axes_dim.size()), "[FluxPosEmbed] ids ",
                ids.describe(), " must be (L, ", axes_dim.size(), "), one column per rope axis");
  auto [cos, sin] = rope_frequencies(ids, axes_dim, theta);
  return {cos, sin};
}

Tensor Timesteps::operator()(const Tensor& timesteps) const {
  return timestep_embedding(timesteps, num_channels, flip_sin_to_cos, downscale_freq_shift);
}

TimestepEmbedding::TimestepEmbedding(int64_t in_channels, int64_t time_embed_dim, bool bias)
    : linear_1(in_channels, time_embed_dim, bias), linear_2(time_embed_dim, time_embed_dim, bias) {
  register_module("linear_1", &linear_1);
  register_module("linear_2", &linear_2);
}

Tensor TimestepEmbedding::operator()(const Tensor& sample) const {
  return linear_2(silu(linear_1(sample)));
}

PixArtAlphaTextProjection::PixArtAlphaTextProjection(int64_t in_features, int64_t hidden_size)
    : linear_1(in_features, hidden_size), linear_2(hidden_size, hidden_size) {
  register_module("linear_1", &linear_1);
  register_module("linear_2", &linear_2);
}

Tensor PixArtAlphaTextProjection::operator()(const Tensor& caption) const {
  return linear_2(silu(linear_1(caption)));
}

CombinedTimestepTextProjEmbeddings::CombinedTimestepTextProjEmbeddings(
    int64_t embedding_dim, int64_t pooled_projection_dim, bool guidance)
    : guidance_embeds(guidance),
      timestep_embedder(256, embedding_dim),
      text_embedder(pooled_projection_dim, embedding_dim) {
  register_module("timestep_embedder", &timestep_embedder);
  if (guidance_embeds) {
    guidance_embedder = std::make_unique<TimestepEmbedding>(256, embedding_dim);
    register_module("guidance_embedder", guidance_embedder.get());
  }
  register_module("text_embedder", &text_embedder);
}

Tensor CombinedTimestepTextProjEmbeddings::operator()(const Tensor& timestep,
                                                      const Tensor& guidance,
                                                      const Tensor& pooled_projection) const {
  // The projection runs in fp32; diffusers then casts it to the pooled projection's dtype.
  const DType dt = pooled_projection.dtype();
  Tensor emb = timestep_embedder(astype(time_proj(timestep), dt));
  if (guidance_embeds) {
    TESSERA_CHECK(guidance.defined(),
                  "[CombinedTimestepGuidanceTextProjEmbeddings] guidance is required");
    emb = emb + (*guidance_embedder)(astype(time_proj(guidance), dt));
  }
  return emb + text_embedder(pooled_projection);
}

}  // namespace tessera::nn
