#include "nn/layers.h"

#include "distributed/collectives.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linalg.h"
#include "runtime/error.h"

namespace tessera::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias)
    : in_features(in), out_features(out), bias_registered_(has_bias) {
  register_parameter("weight", &weight, {out, in});
  if (has_bias) register_parameter("bias", &bias, {out});
}

Tensor Linear::operator()(const Tensor& x) const {
  if (parallel_style != ParallelStyle::rowwise) return linear(x, weight, bias);
  // Partial sums of this rank's input features, summed over the ranks, then the bias once.
  Tensor y = all_reduce(linear(x, weight, Tensor()), tp_group);
  return bias.defined() ? y + bias : y;
}

void Linear::parallelize(ParallelStyle style, const TensorParallelConfig& tp,
                         const std::vector<int64_t>& packed, const std::string& where) {
  const int64_t n = tp.degree();
  if (style == ParallelStyle::replicate || n == 1) return;
  const int64_t features = style == ParallelStyle::colwise ? out_features : in_features;
  const char* what = style == ParallelStyle::colwise ? "out_features" : "in_features";
  int64_t total = 0;
  for (int64_t b : packed) {
    TESSERA_CHECK(b % n == 0, "[tensor parallel] ", where, ": a packed block of ", b, " ", what,
                  " is not divisible by the tensor-parallel degree ", n);
    total += b;
  }
  TESSERA_CHECK(packed.empty() || total == features, "[tensor parallel] ", where,
                ": packed blocks sum to ", total, " but the layer has ", features, " ", what);
  TESSERA_CHECK(features % n == 0, "[tensor parallel] ", where, ": ", what, "=", features,
                " is not divisible by the tensor-parallel degree ", n);
  ShardSpec spec;
  spec.dim = style == ParallelStyle::colwise ? 0 : 1;
  spec.parts = n;
  spec.packed = packed;
  split_parameter_for(tp, "weight", spec);
  if (style == ParallelStyle::colwise && bias_registered_) {
    ShardSpec b = spec;
    b.dim = 0;
    split_parameter_for(tp, "bias", b);
  }
  // SPMD: this layer computes as if whole; XLA's partitioner inserts a row-wise split's
  // all-reduce.
  if (tp.spmd()) return;
  parallel_style = style;
  tp_group = tp.group;
  tp_degree = n;
}

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

Embedding::Embedding(int64_t n, int64_t dim) : num_embeddings(n), embedding_dim(dim) {
  register_parameter("weight", &weight, {n, dim});
}

void Embedding::parallelize(ParallelStyle style, const TensorParallelConfig& tp,
                            const std::string& where) {
  const int64_t n = tp.degree();
  if (style == ParallelStyle::replicate || n == 1) return;
  TESSERA_CHECK(style == ParallelStyle::colwise, "[tensor parallel] ", where,
                ": an Embedding is split colwise (its embedding_dim) only; ",
                parallel_style_name(style), " is not implemented");
  TESSERA_CHECK(embedding_dim % n == 0, "[tensor parallel] ", where, ": embedding_dim=",
                embedding_dim, " is not divisible by the tensor-parallel degree ", n);
  ShardSpec spec;
  spec.dim = 1;
  spec.parts = n;
  split_parameter_for(tp, "weight", spec);
}

Tensor Embedding::operator()(const Tensor& ids) const { return embedding(weight, ids); }

}  // namespace tessera::nn
