#include "ops/embedding.h"

#include "runtime/error.h"

namespace tessera {

void TimestepEmbedding::hash_attributes(Hasher& h) const {
  h.add(uint64_t(dim_));
  h.add(flip_);
  h.add_double(shift_);
  h.add_double(scale_);
  h.add_double(max_period_);
}

bool TimestepEmbedding::equal_attributes(const Primitive& o) const {
  const auto& t = static_cast<const TimestepEmbedding&>(o);
  return t.dim_ == dim_ && t.flip_ == flip_ && t.shift_ == shift_ && t.scale_ == scale_ &&
         t.max_period_ == max_period_;
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  TESSERA_CHECK(weight.defined() && ids.defined(), "[embedding] got an undefined tensor");
  TESSERA_CHECK(weight.ndim() == 2, "[embedding] weight has shape ", shape_str(weight.shape()),
                ", expected (num_embeddings, dim)");
  TESSERA_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "[embedding] ids are ",
                ids.describe(), ", expected i64 or i32");
  Shape out = ids.shape();
  out.push_back(weight.shape()[1]);
  return dispatch1(std::make_shared<Embedding>(), {weight, ids}, {out, weight.dtype()});
}

Tensor timestep_embedding(const Tensor& timesteps, int64_t dim, bool flip_sin_to_cos,
                          double downscale_freq_shift, double scale, double max_period) {
  TESSERA_CHECK(timesteps.defined() && timesteps.ndim() == 1, "[timestep_embedding] timesteps ",
                timesteps.defined() ? shape_str(timesteps.shape()) : "undefined",
                ", expected a 1-D tensor");
  TESSERA_CHECK(dim >= 2, "[timestep_embedding] dim ", dim, ", expected >= 2");
  TESSERA_CHECK(double(dim / 2) != downscale_freq_shift, "[timestep_embedding] dim / 2 equals ",
                "downscale_freq_shift (", downscale_freq_shift, "), expected them to differ");
  return dispatch1(std::make_shared<TimestepEmbedding>(dim, flip_sin_to_cos, downscale_freq_shift,
                                                       scale, max_period),
                   {timesteps}, {{timesteps.shape()[0], dim}, DType::f32});
}

}  // namespace tessera
