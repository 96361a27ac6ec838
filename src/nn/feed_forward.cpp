#include "nn/feed_forward.h"

#include "ops/elementwise.h"

namespace tessera::nn {

GELU::GELU(int64_t dim_in, int64_t dim_out) : proj(dim_in, dim_out) {
  register_module("proj", &proj);
}

Tensor GELU::operator()(const Tensor& x) const {
  return gelu(proj(x), true);
}

FeedForward::FeedForward(int64_t dim, int64_t dim_out, int64_t mult)
    : act(dim, dim * mult), out(dim * mult, dim_out) {
  register_module("net.0", &act);
  register_module("net.2", &out);
}

Tensor FeedForward::operator()(const Tensor& x) const {
  return out(act(x));
}

}  // namespace tessera::nn
