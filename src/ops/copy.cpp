#include "ops/copy.h"

#include "runtime/fusion.h"

namespace tessera {

// astype (FLUX's f32 q/k norms rounded back to bf16) fuses when rows of the source are read as
// runs; a transposing copy stays a kernel of its own.
Fusion Copy::fusion(const std::vector<Tensor>& in) const {
  const Tensor& x = in[0];
  const bool runs = in.size() == 1 && x.ndim() >= 1 && (x.strides().back() == 1 || x.shape().back() == 1);
  return runs ? Fusion::elementwise : Fusion::none;
}
void Copy::fused_instr(FusedInstr& instr, const std::vector<Tensor>&) const {
  instr.kind = FusedInstr::convert;  // the rounding to the output dtype is the conversion
}

Tensor clone(const Tensor& t) {
  return dispatch1(std::make_shared<Copy>(), {t}, {t.shape(), t.dtype()});
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor astype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  return dispatch1(std::make_shared<Copy>(), {t}, {t.shape(), dtype});
}

}  // namespace tessera
