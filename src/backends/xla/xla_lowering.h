// StableHLO lowerings of tessera's primitives (one function per op family in xla_lowering.cpp).
// Each computes what the primitive's eval_cpu computes, in torch's precision: reduced-precision
// floats load to f32, compute in f32 and round once on output, as the CPU kernels do.
#pragma once
#include <vector>

#include "backends/xla/stablehlo.h"
#include "runtime/primitive.h"

namespace tessera::xla {

// Lowers `p` on `ins` (values of the inputs' logical shapes; dtypes `in_dtypes`) to one value
// per output spec (its shape and element type). False: no lowering for this op or these dtypes.
bool lower(Hlo& h, const Primitive& p, const std::vector<Val>& ins,
           const std::vector<DType>& in_dtypes, const std::vector<TensorSpec>& outs,
           std::vector<Val>& results);

// Value `x` (element type of dtype `from`) converted to dtype `to` with torch's rules: floats
// round to nearest even, f8e4m3 saturates to +-448, floats to integers truncate, to bool is != 0.
Val convert_dtype(Hlo& h, const Val& x, DType from, DType to);

}  // namespace tessera::xla
