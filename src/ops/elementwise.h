// Elementwise ops with numpy/torch broadcasting and torch's type promotion. Floating inputs are
// loaded to fp32, computed in fp32 and rounded once to the output dtype on store, as PyTorch's
// vectorised CPU kernels do for bf16/f16.
#pragma once
#include <cstdint>

#include "runtime/elementwise_op.h"
#include "runtime/primitive.h"

namespace tessera {

const char* binary_op_name(BinaryOp op);
const char* unary_op_name(UnaryOp op);

// a op b, both broadcast to the output shape.
class Binary final : public Primitive {
 public:
  explicit Binary(BinaryOp op) : op_(op) {}
  const char* name() const override { return binary_op_name(op_); }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  Fusion fusion(const std::vector<Tensor>& in) const override;
  void fused_instr(FusedInstr& instr, const std::vector<Tensor>& in) const override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(op_)); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const Binary&>(o).op_ == op_;
  }
  BinaryOp op() const { return op_; }

 private:
  BinaryOp op_;
};

// x op scalar (or scalar op x when scalar_first), with torch's CPU handling of a Python scalar
// on a bf16/f16 tensor: mul and div keep it in fp32; add, sub and pow round it to the tensor's
// dtype first; pow by 2, 3, 0.5, -0.5, -1, -2 uses torch's special forms (x*x, x*x*x, sqrt,
// ...), rounding intermediates as torch's reduced-precision arithmetic does. s / x is
// reciprocal(x) * s as in Python (composed by div(s, x)).
class BinaryScalar final : public Primitive {
 public:
  BinaryScalar(BinaryOp op, double scalar, bool scalar_first)
      : op_(op), scalar_(scalar), scalar_first_(scalar_first) {}
  const char* name() const override { return binary_op_name(op_); }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  Fusion fusion(const std::vector<Tensor>& in) const override;
  void fused_instr(FusedInstr& instr, const std::vector<Tensor>& in) const override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;
  BinaryOp op() const { return op_; }
  double scalar() const { return scalar_; }
  bool scalar_first() const { return scalar_first_; }

 private:
  BinaryOp op_;
  double scalar_;
  bool scalar_first_;
};

class Unary final : public Primitive {
 public:
  explicit Unary(UnaryOp op) : op_(op) {}
  const char* name() const override { return unary_op_name(op_); }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  Fusion fusion(const std::vector<Tensor>& in) const override;
  void fused_instr(FusedInstr& instr, const std::vector<Tensor>& in) const override;
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(op_)); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const Unary&>(o).op_ == op_;
  }
  UnaryOp op() const { return op_; }

 private:
  UnaryOp op_;
};

// Gated linear units on the last dim split in halves [first | second]. gate_first=false is
// diffusers' SwiGLU/GEGLU (first * act(second)); gate_first=true is FLUX.2's Flux2SwiGLU
// (act(first) * second). For bf16 the activation is rounded to bf16 before the product, as the
// two separate torch ops round.
class Glu final : public Primitive {
 public:
  Glu(UnaryOp act, bool gate_first) : act_(act), gate_first_(gate_first) {}
  const char* name() const override { return "glu"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override {
    h.add(uint64_t(act_));
    h.add(gate_first_);
  }
  bool equal_attributes(const Primitive& o) const override {
    const auto& g = static_cast<const Glu&>(o);
    return g.act_ == act_ && g.gate_first_ == gate_first_;
  }

  UnaryOp act() const { return act_; }
  bool gate_first() const { return gate_first_; }

 private:
  UnaryOp act_;
  bool gate_first_;
};

// where(cond, a, b): cond is bool (or any dtype, nonzero = true); all three broadcast.
class Where final : public Primitive {
 public:
  const char* name() const override { return "where"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
};

// torch.result_type for two tensors: a 0-dim tensor does not promote a dimensioned one of the
// same category; bf16 with f16 or f32 gives f32; integers with floats give the float dtype.
DType promote_types(const Tensor& a, const Tensor& b);
// The same for two dimensioned operands of dtypes a and b.
DType promote_dtypes(DType a, DType b);
// The broadcast shape of a and b, or an error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary(BinaryOp op, const Tensor& a, double s);
Tensor binary(BinaryOp op, double s, const Tensor& a);
Tensor unary(UnaryOp op, const Tensor& x);

inline Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::add, a, b);
}
inline Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::sub, a, b);
}
inline Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::mul, a, b);
}
inline Tensor div(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::div, a, b);
}
inline Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::maximum, a, b);
}
inline Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::minimum, a, b);
}
inline Tensor pow(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::pow, a, b);
}
inline Tensor add(const Tensor& a, double s) {
  return binary(BinaryOp::add, a, s);
}
inline Tensor sub(const Tensor& a, double s) {
  return binary(BinaryOp::sub, a, s);
}
inline Tensor sub(double s, const Tensor& a) {
  return binary(BinaryOp::sub, s, a);
}
inline Tensor mul(const Tensor& a, double s) {
  return binary(BinaryOp::mul, a, s);
}
inline Tensor div(const Tensor& a, double s) {
  return binary(BinaryOp::div, a, s);
}
inline Tensor div(double s, const Tensor& a) {
  return binary(BinaryOp::div, s, a);
}
inline Tensor pow(const Tensor& a, double s) {
  return binary(BinaryOp::pow, a, s);
}
inline Tensor maximum(const Tensor& a, double s) {
  return binary(BinaryOp::maximum, a, s);
}
inline Tensor minimum(const Tensor& a, double s) {
  return binary(BinaryOp::minimum, a, s);
}

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator+(const Tensor& a, double s) {
  return add(a, s);
}
inline Tensor operator-(const Tensor& a, double s) {
  return sub(a, s);
}
inline Tensor operator*(const Tensor& a, double s) {
  return mul(a, s);
}
inline Tensor operator/(const Tensor& a, double s) {
  return div(a, s);
}
inline Tensor operator+(double s, const Tensor& a) {
  return add(a, s);
}
inline Tensor operator-(double s, const Tensor& a) {
  return sub(s, a);
}
inline Tensor operator*(double s, const Tensor& a) {
  return mul(a, s);
}
inline Tensor operator/(double s, const Tensor& a) {
  return div(s, a);
}

inline Tensor neg(const Tensor& x) {
  return unary(UnaryOp::neg, x);
}
inline Tensor abs(const Tensor& x) {
  return unary(UnaryOp::abs, x);
}
inline Tensor exp(const Tensor& x) {
  return unary(UnaryOp::exp, x);
}
inline Tensor log(const Tensor& x) {
  return unary(UnaryOp::log, x);
}
inline Tensor sqrt(const Tensor& x) {
  return unary(UnaryOp::sqrt, x);
}
inline Tensor rsqrt(const Tensor& x) {
  return unary(UnaryOp::rsqrt, x);
}
inline Tensor tanh(const Tensor& x) {
  return unary(UnaryOp::tanh, x);
}
inline Tensor sigmoid(const Tensor& x) {
  return unary(UnaryOp::sigmoid, x);
}
inline Tensor sin(const Tensor& x) {
  return unary(UnaryOp::sin, x);
}
inline Tensor cos(const Tensor& x) {
  return unary(UnaryOp::cos, x);
}
inline Tensor square(const Tensor& x) {
  return unary(UnaryOp::square, x);
}
inline Tensor silu(const Tensor& x) {
  return unary(UnaryOp::silu, x);
}
// approximate=true is F.gelu(x, approximate="tanh").
inline Tensor gelu(const Tensor& x, bool approximate = false) {
  return unary(approximate ? UnaryOp::gelu_tanh : UnaryOp::gelu, x);
}
inline Tensor quick_gelu(const Tensor& x) {
  return unary(UnaryOp::quick_gelu, x);
}
inline Tensor relu(const Tensor& x) {
  return unary(UnaryOp::relu, x);
}
inline Tensor operator-(const Tensor& x) {
  return neg(x);
}

// Gated units over the last dim (see Glu). act is silu, gelu or gelu_tanh.
Tensor glu(const Tensor& x, UnaryOp act, bool gate_first);
inline Tensor swiglu(const Tensor& x, bool gate_first = false) {
  return glu(x, UnaryOp::silu, gate_first);
}
inline Tensor geglu(const Tensor& x, bool approximate = false) {
  return glu(x, approximate ? UnaryOp::gelu_tanh : UnaryOp::gelu, false);
}

// torch.where(cond, a, b) and x.masked_fill(mask, value).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace tessera
