// The leaf modules every model is built from, with the parameter names torch.nn and diffusers
// give them ("weight", "bias"), so checkpoint keys map onto them directly.
#pragma once
#include <array>

#include "nn/module.h"
#include "ops/conv.h"
#include "ops/norm.h"

namespace tessera::nn {

// torch.nn.Linear: y = x W^T + b.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor operator()(const Tensor& x) const;
  // Tensor parallelism (distributed/tensor_parallel.h): colwise keeps this rank's output
  // features (the input is whole, the output this rank's slice); rowwise keeps its input
  // features (the input is this rank's slice) and sums the partial outputs over the group before
  // adding the bias. `packed`: the fused blocks along the split features, each split on its own.
  // A width the degree does not divide is an error naming `where`.
  void parallelize(ParallelStyle style, const TensorParallelConfig& tp,
                   const std::vector<int64_t>& packed, const std::string& where);
  int64_t in_features, out_features;  // the checkpoint's (whole) sizes
  Tensor weight, bias;
  ParallelStyle parallel_style = ParallelStyle::replicate;
  std::shared_ptr<ProcessGroup> tp_group;  // rowwise: the all-reduce's group
  int64_t tp_degree = 1;  // ranks the split features are spread over (1: not split)

 private:
  bool bias_registered_;
};

// torch.nn.Conv2d with symmetric padding.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true);
  Tensor operator()(const Tensor& x) const;
  Tensor forward(const Tensor& x, const Conv2dParams& params) const;  // explicit padding
  int64_t in_channels, out_channels, kernel_size, stride, padding;
  Tensor weight, bias;
};

// torch.nn.LayerNorm over the last dimension (elementwise_affine optional).
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  Tensor operator()(const Tensor& x) const;
  double eps;
  Tensor weight, bias;
};

// diffusers' RMSNorm (style diffusers) or transformers' T5/Llama RMS norms (style llama).
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps, bool elementwise_affine = true,
          RmsNormStyle style = RmsNormStyle::diffusers);
  Tensor operator()(const Tensor& x) const;
  double eps;
  RmsNormStyle style;
  Tensor weight;
};

// torch.nn.GroupNorm on NCHW.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor operator()(const Tensor& x) const;
  int64_t num_groups;
  double eps;
  Tensor weight, bias;
};

// torch.nn.Embedding.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor operator()(const Tensor& ids) const;
  // Tensor parallelism, as torch's ColwiseParallel applies to an nn.Embedding: colwise keeps this
  // rank's embedding_dim columns (T5's relative-attention bias table: one column per head, so a
  // rank looks up only its heads' biases). Rowwise (vocabulary split, masked lookups and an
  // all-reduce) is not implemented: an error naming `where`.
  void parallelize(ParallelStyle style, const TensorParallelConfig& tp, const std::string& where);
  int64_t num_embeddings, embedding_dim;  // the checkpoint's (whole) sizes
  Tensor weight;
};

}  // namespace tessera::nn
