// diffusers' FeedForward (models/attention.py) and its GELU projection (models/activations.py).
#pragma once
#include <cstdint>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::nn {

// GELU(dim_in, dim_out, approximate="tanh"): proj then gelu.
class GELU : public Module {
 public:
  GELU(int64_t dim_in, int64_t dim_out);
  Tensor operator()(const Tensor& x) const;
  Linear proj;
};

// FeedForward(dim, dim_out, mult, activation_fn="gelu-approximate"): net.0 (GELU), net.2
// (Linear); net.1 is a parameterless dropout.
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t dim_out, int64_t mult = 4);
  Tensor operator()(const Tensor& x) const;
  GELU act;    // net.0
  Linear out;  // net.2
};

}  // namespace tessera::nn
