#include "ops/copy.h"

namespace tessera {

Tensor clone(const Tensor& t) {
  return dispatch1(std::make_shared<Copy>(), {t}, {t.shape(), t.dtype()});
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor astype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  return dispatch1(std::make_shared<Copy>(), {t}, {t.shape(), dtype});
}

}  // namespace tessera
