// The elementwise operations: ops/elementwise.h's primitives and the instruction set of fused
// kernels (runtime/fusion.h), which the runtime builds without knowing the ops.
#pragma once
#include <cstdint>

namespace tessera {

enum class BinaryOp : uint8_t { add, sub, mul, div, maximum, minimum, pow };
enum class UnaryOp : uint8_t {
  neg,
  abs,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  sin,
  cos,
  square,
  silu,
  gelu,
  gelu_tanh,
  quick_gelu,
  relu
};

}  // namespace tessera
