// The fusion pass of deferred and compiled mode: chains of elementwise ops and astype of one
// shape (and row-wise norms feeding them) become one FusedKernel primitive that evaluates a small
// program per chunk of rows, rounding each value where the unfused op would store it (so results
// are bit-identical).
#pragma once
#include <string>
#include <vector>

#include "runtime/elementwise_op.h"
#include "runtime/primitive.h"

namespace tessera {

struct FusedOperand {
  bool is_input = true;  // input `index` of the kernel, else value `index`
  int index = 0;
};

struct FusedInstr {
  // convert: astype / contiguous (Copy): the operand rounded to the output dtype.
  enum Kind : uint8_t { binary, binary_scalar, unary, rowwise, convert } kind = binary;
  BinaryOp bop = BinaryOp::add;
  UnaryOp uop = UnaryOp::neg;
  float scalar = 0.f;
  bool scalar_first = false;
  FusedOperand a, b;
  DType dtype = DType::f32;  // the op's output dtype; the value is rounded to it
  // rowwise: a primitive whose output row r depends only on row r of its first input (norms
  // over the last dim), run per block of rows into scratch; its inputs are kernel inputs.
  PrimitivePtr row_prim;
  std::vector<int> row_inputs;
};

class FusedKernel final : public Primitive {
 public:
  FusedKernel(std::vector<FusedInstr> prog, std::vector<int> out_values, std::string label)
      : prog_(std::move(prog)), out_values_(std::move(out_values)), label_(std::move(label)) {}
  const char* name() const override { return label_.c_str(); }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  const std::vector<FusedInstr>& program() const { return prog_; }
  const std::vector<int>& out_values() const { return out_values_; }

 private:
  std::vector<FusedInstr> prog_;
  std::vector<int> out_values_;  // value index of each output
  std::string label_;            // "fused(layer_norm,mul,add,silu)"
};

// Can `p` with these input/output descriptions be part of a fused kernel (Primitive::fusion, on
// floating tensors, one output)? Sets *rowwise for row-wise ops (their inputs come from outside
// the kernel).
bool is_fusible(const Primitive& p, const std::vector<Tensor>& inputs,
                const std::vector<TensorSpec>& outputs, bool* rowwise);

// Appends the instruction for p. `operands` says where each input of p comes from.
void append_fused_instr(std::vector<FusedInstr>& prog, const PrimitivePtr& p,
                        const std::vector<Tensor>& inputs,
                        const std::vector<FusedOperand>& operands, DType out_dtype);

}  // namespace tessera
