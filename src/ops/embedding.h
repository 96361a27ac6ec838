// Embedding lookups: a table gather by token id, and diffusers' sinusoidal timestep embedding.
#pragma once
#include "runtime/primitive.h"

namespace tessera {

// weight[V, D] gathered by ids (i64/i32, any shape) -> ids.shape + (D), weight's dtype.
class Embedding final : public Primitive {
 public:
  const char* name() const override { return "embedding"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
};

// diffusers.models.embeddings.get_timestep_embedding, op for op in fp32.
class TimestepEmbedding final : public Primitive {
 public:
  TimestepEmbedding(int64_t dim, bool flip_sin_to_cos, double downscale_freq_shift, double scale,
                    double max_period)
      : dim_(dim),
        flip_(flip_sin_to_cos),
        shift_(downscale_freq_shift),
        scale_(scale),
        max_period_(max_period) {}
  const char* name() const override { return "timestep_embedding"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;

  int64_t dim() const { return dim_; }
  bool flip_sin_to_cos() const { return flip_; }
  double downscale_freq_shift() const { return shift_; }
  double scale() const { return scale_; }
  double max_period() const { return max_period_; }

 private:
  int64_t dim_;
  bool flip_;
  double shift_, scale_, max_period_;
};

// F.embedding(ids, weight). An id outside [0, V) is an error naming the id and V.
Tensor embedding(const Tensor& weight, const Tensor& ids);
// timesteps[N] (any numeric dtype) -> [N, dim] f32. FLUX's Timesteps(256, True, 0) is
// timestep_embedding(t, 256, true, 0).
Tensor timestep_embedding(const Tensor& timesteps, int64_t dim, bool flip_sin_to_cos = false,
                          double downscale_freq_shift = 1.0, double scale = 1.0,
                          double max_period = 10000.0);

}  // namespace tessera
