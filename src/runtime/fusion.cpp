#include "runtime/fusion.h"

#include "runtime/error.h"

namespace tessera {
namespace {

bool all_float(const std::vector<Tensor>& inputs, const std::vector<TensorSpec>& outputs) {
  for (const auto& t : inputs)
    if (!is_floating(t.dtype())) return false;
  for (const auto& s : outputs)
    if (!is_floating(s.dtype)) return false;
  return outputs.size() == 1;
}

}  // namespace

bool is_fusible(const Primitive& p, const std::vector<Tensor>& inputs,
                const std::vector<TensorSpec>& outputs, bool* rowwise) {
  *rowwise = false;
  if (!all_float(inputs, outputs)) return false;
  switch (p.fusion(inputs)) {
    case Fusion::elementwise: return true;
    case Fusion::rowwise: *rowwise = true; return true;
    case Fusion::none: break;
  }
  return false;
}

void append_fused_instr(std::vector<FusedInstr>& prog, const PrimitivePtr& p,
                        const std::vector<Tensor>& inputs,
                        const std::vector<FusedOperand>& operands, DType out_dtype) {
  FusedInstr ins;
  ins.dtype = out_dtype;
  if (p->fusion(inputs) == Fusion::elementwise) {
    p->fused_instr(ins, inputs);
    ins.a = operands[0];
    if (operands.size() > 1) ins.b = operands[1];
  } else {
    ins.kind = FusedInstr::rowwise;
    ins.row_prim = p;
    for (const auto& o : operands) {
      TESSERA_CHECK(o.is_input, "[fusion] internal: row-wise op ", p->name(),
                    " reads a fused value");
      ins.row_inputs.push_back(o.index);
    }
  }
  prog.push_back(std::move(ins));
}

void FusedKernel::hash_attributes(Hasher& h) const {
  for (const auto& i : prog_) {
    h.add(i.kind);
    h.add(uint64_t(i.bop));
    h.add(uint64_t(i.uop));
    h.add_double(i.scalar);
    h.add(i.scalar_first);
    h.add(i.a.is_input * 1000003ull + i.a.index);
    h.add(i.b.is_input * 1000003ull + i.b.index);
    h.add(uint64_t(i.dtype));
    if (i.row_prim) {
      h.add_string(i.row_prim->name());
      i.row_prim->hash_attributes(h);
    }
  }
  for (int v : out_values_) h.add(uint64_t(v));
}

}  // namespace tessera
