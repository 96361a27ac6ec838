// Copies and casts: the ops that turn any view into a contiguous tensor of any dtype.
#pragma once
#include "runtime/primitive.h"

namespace tessera {

// Strided copy with dtype conversion (torch's .to(dtype) rounding).
class Copy final : public Primitive {
 public:
  const char* name() const override { return "copy"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  Fusion fusion(const std::vector<Tensor>& in) const override;
  void fused_instr(FusedInstr& instr, const std::vector<Tensor>& in) const override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;
};

// A contiguous tensor with the same values (returns `t` itself when already contiguous).
Tensor contiguous(const Tensor& t);
// `t` converted to `dtype` (returns `t` itself when the dtype already matches).
Tensor astype(const Tensor& t, DType dtype);
// A contiguous copy, always new memory.
Tensor clone(const Tensor& t);

}  // namespace tessera
