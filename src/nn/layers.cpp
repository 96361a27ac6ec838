#include "nn/layers.h"

#include "ops/embedding.h"
#include "ops/linalg.h"

namespace tessera::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias) : in_features(in), out_features(out) {
  register_parameter("weight", &weight, {out, in});
  if (has_bias) register_parameter("bias", &bias, {out});
}

Tensor Linear::operator()(const Tensor& x) const { return linear(x, weight, bias); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, bool has_bias)
    : in_channels(in), out_channels(out), kernel_size(k), stride(s), padding(p) {
  register_parameter("weight", &weight, {out, in, k, k});
  if (has_bias) register_parameter("bias", &bias, {out});
}

Tensor Conv2d::operator()(const Tensor& x) const {
  return conv2d(x, weight, bias, {stride, stride}, {padding, padding});
}

Tensor Conv2d::forward(const Tensor& x, const Conv2dParams& params) const {
  return conv2d(x, weight, bias, params);
}

LayerNorm::LayerNorm(int64_t dim, double e, bool affine, bool has_bias) : eps(e) {
  if (affine) {
    register_parameter("weight", &weight, {dim});
    if (has_bias) register_parameter("bias", &bias, {dim});
  }
}

Tensor LayerNorm::operator()(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double e, bool affine, RmsNormStyle s) : eps(e), style(s) {
  if (affine) register_parameter("weight", &weight, {dim});
}

Tensor RMSNorm::operator()(const Tensor& x) const { return rms_norm(x, weight, eps, style); }

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double e, bool affine)
    : num_groups(groups), eps(e) {
  if (affine) {
    register_parameter("weight", &weight, {channels});
    register_parameter("bias", &bias, {channels});
  }
}

Tensor GroupNorm::operator()(const Tensor& x) const {
  return group_norm(x, num_groups, weight, bias, eps);
}

Embedding::Embedding(int64_t n, int64_t dim) { register_parameter("weight", &weight, {n, dim}); }

Tensor Embedding::operator()(const Tensor& ids) const { return embedding(weight, ids); }

}  // namespace tessera::nn
