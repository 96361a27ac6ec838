// Helpers shared by the lowering files (xla_lowering.cpp, xla_lowering_nn.cpp); not a public
// interface of the backend.
#pragma once
#include <vector>

#include "backends/xla/stablehlo.h"
#include "backends/xla/xla_lowering.h"

namespace tessera::xla {

inline bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f8e4m3 ||
         t == DType::f8e5m2;
}
inline bool is_intlike(DType t) {
  return t == DType::i64 || t == DType::i32;
}
// x as f32 (floats widen exactly; integers and bool convert as torch's .float()).
inline Val to_f32(Hlo& h, const Val& x, DType from) {
  return convert_dtype(h, x, from, DType::f32);
}
// Rounds an f32 value to dtype t and back (torch storing an intermediate in t).
inline Val round_through(Hlo& h, const Val& x, DType t) {
  if (t == DType::f32) return x;
  return h.convert(h.convert(x, element_type(t)), "f32");
}

// The network blocks' lowerings (xla_lowering_nn.cpp); matched: the primitive is one of them.
bool lower_nn(Hlo& h, const Primitive& p, const std::vector<Val>& in, const std::vector<DType>& dt,
              const std::vector<TensorSpec>& outs, std::vector<Val>& results, bool& matched);

}  // namespace tessera::xla
