#include "ops/softmax.h"

#include "runtime/error.h"

namespace tessera {

Tensor softmax(const Tensor& x, int64_t dim) {
  TESSERA_CHECK(is_floating(x.dtype()), "[softmax] needs a floating dtype, got ", x.describe());
  TESSERA_CHECK(x.ndim() > 0, "[softmax] needs at least one dimension, got a scalar");
  const int64_t d = normalize_dim(dim, x.ndim(), "softmax");
  return dispatch1(std::make_shared<Softmax>(d), {x}, {x.shape(), x.dtype()});
}

}  // namespace tessera
