#include "runtime/fusion.h"

#include "ops/copy.h"
#include "ops/norm.h"
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

// Rounds a scalar as BinaryScalar::eval_cpu does for a bf16/f16 tensor (add, sub).
float scalar_as_torch(BinaryOp op, double s, DType in, DType out) {
  float f = float(s);
  const bool reduced = (out == DType::bf16 || out == DType::f16) && in == out;
  if (reduced && (op == BinaryOp::add || op == BinaryOp::sub)) {
    float v[1] = {f};
    uint16_t h;
    convert_elements(v, DType::f32, &h, out, 1);
    convert_elements(&h, out, v, DType::f32, 1);
    f = v[0];
  }
  return f;
}

}  // namespace

bool is_fusible(const Primitive& p, const std::vector<Tensor>& inputs,
                const std::vector<TensorSpec>& outputs, bool* rowwise) {
  *rowwise = false;
  if (!all_float(inputs, outputs)) return false;
  if (dynamic_cast<const Binary*>(&p)) return inputs.size() == 2;
  if (auto* s = dynamic_cast<const BinaryScalar*>(&p))
    return inputs.size() == 1 && s->op() != BinaryOp::pow;
  if (dynamic_cast<const Unary*>(&p)) return inputs.size() == 1;
  if (dynamic_cast<const Copy*>(&p)) {
    // astype (FLUX's f32 q/k norms rounded back to bf16): rows of the source must be read as
    // runs; a transposing copy stays a kernel of its own.
    const Tensor& x = inputs[0];
    return inputs.size() == 1 && x.ndim() >= 1 &&
           (x.strides().back() == 1 || x.shape().back() == 1);
  }
  if (dynamic_cast<const LayerNorm*>(&p) || dynamic_cast<const RmsNorm*>(&p)) {
    const Tensor& x = inputs[0];
    if (x.ndim() < 1 || x.shape().back() == 0 || !x.is_contiguous()) return false;
    *rowwise = true;
    return true;
  }
  return false;
}

void append_fused_instr(std::vector<FusedInstr>& prog, const PrimitivePtr& p,
                        const std::vector<Tensor>& inputs,
                        const std::vector<FusedOperand>& operands, DType out_dtype) {
  FusedInstr ins;
  ins.dtype = out_dtype;
  if (auto* b = dynamic_cast<const Binary*>(p.get())) {
    ins.kind = FusedInstr::binary;
    ins.bop = b->op();
    ins.a = operands[0];
    ins.b = operands[1];
  } else if (auto* s = dynamic_cast<const BinaryScalar*>(p.get())) {
    ins.kind = FusedInstr::binary_scalar;
    ins.bop = s->op();
    ins.scalar = scalar_as_torch(s->op(), s->scalar(), inputs[0].dtype(), out_dtype);
    ins.scalar_first = s->scalar_first();
    ins.a = operands[0];
  } else if (auto* u = dynamic_cast<const Unary*>(p.get())) {
    ins.kind = FusedInstr::unary;
    ins.uop = u->op();
    ins.a = operands[0];
  } else if (dynamic_cast<const Copy*>(p.get())) {
    ins.kind = FusedInstr::convert;
    ins.a = operands[0];
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
