#include "ops/resample.h"

#include "runtime/error.h"

namespace tessera {

Tensor upsample_nearest(const Tensor& x, int64_t factor) {
  TESSERA_CHECK(x.defined() && x.ndim() == 4, "[upsample_nearest] input ",
                x.defined() ? shape_str(x.shape()) : "undefined", ", expected (N, C, H, W)");
  TESSERA_CHECK(factor >= 1, "[upsample_nearest] factor ", factor, ", expected >= 1");
  const Shape& s = x.shape();
  return dispatch1(std::make_shared<UpsampleNearest>(factor), {x},
                   {{s[0], s[1], s[2] * factor, s[3] * factor}, x.dtype()});
}

}  // namespace tessera
