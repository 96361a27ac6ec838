#include "ops/elementwise.h"

#include <cmath>

#include "runtime/error.h"
#include "runtime/fusion.h"

namespace tessera {

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
    case BinaryOp::maximum:
      return "maximum";
    case BinaryOp::minimum:
      return "minimum";
    case BinaryOp::pow:
      return "pow";
  }
  return "binary";
}

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return "neg";
    case UnaryOp::abs:
      return "abs";
    case UnaryOp::exp:
      return "exp";
    case UnaryOp::log:
      return "log";
    case UnaryOp::sqrt:
      return "sqrt";
    case UnaryOp::rsqrt:
      return "rsqrt";
    case UnaryOp::tanh:
      return "tanh";
    case UnaryOp::sigmoid:
      return "sigmoid";
    case UnaryOp::sin:
      return "sin";
    case UnaryOp::cos:
      return "cos";
    case UnaryOp::square:
      return "square";
    case UnaryOp::silu:
      return "silu";
    case UnaryOp::gelu:
      return "gelu";
    case UnaryOp::gelu_tanh:
      return "gelu_tanh";
    case UnaryOp::quick_gelu:
      return "quick_gelu";
    case UnaryOp::relu:
      return "relu";
  }
  return "unary";
}

void BinaryScalar::hash_attributes(Hasher& h) const {
  h.add(uint64_t(op_));
  h.add_double(scalar_);
  h.add(scalar_first_);
}

bool BinaryScalar::equal_attributes(const Primitive& o) const {
  const auto& s = static_cast<const BinaryScalar&>(o);
  return s.op_ == op_ && s.scalar_ == scalar_ && s.scalar_first_ == scalar_first_;
}

namespace {

bool is_int(DType t) {
  return t == DType::i64 || t == DType::i32;
}

void check_float_or_int(const char* op, DType t) {
  TESSERA_CHECK(is_floating(t) || is_int(t), "[", op, "] unsupported dtype ", dtype_name(t),
                ", expected a float or integer tensor");
}

bool int_op_ok(BinaryOp op) {
  return op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::mul ||
         op == BinaryOp::maximum || op == BinaryOp::minimum;
}

}  // namespace

DType promote_dtypes(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (!fa && !fb) {
    if (a == DType::boolean) return b;
    if (b == DType::boolean) return a;
    return DType::i64;  // i32 with i64
  }
  return DType::f32;  // two different float types: torch gives f32 for bf16/f16 mixes
}

DType promote_types(const Tensor& a, const Tensor& b) {
  const DType ta = a.dtype(), tb = b.dtype();
  // A 0-dim tensor decides the dtype only when its category (float over int) is higher.
  if ((a.ndim() == 0) != (b.ndim() == 0)) {
    const Tensor& dimmed = a.ndim() ? a : b;
    const Tensor& zero = a.ndim() ? b : a;
    return is_floating(zero.dtype()) && !is_floating(dimmed.dtype()) ? zero.dtype()
                                                                     : dimmed.dtype();
  }
  return promote_dtypes(ta, tb);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TESSERA_CHECK(da == db || da == 1 || db == 1, "[", op, "] shapes ", shape_str(a), " and ",
                  shape_str(b), " do not broadcast (dim ", i, ": ", da, " vs ", db,
                  "), expected equal sizes or 1");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  TESSERA_CHECK(a.defined() && b.defined(), "[", name, "] got an undefined tensor");
  check_float_or_int(name, a.dtype());
  check_float_or_int(name, b.dtype());
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType dt = promote_types(a, b);
  // torch: integer true division and (here) integer pow give f32.
  if (is_int(dt) && !int_op_ok(op)) dt = DType::f32;
  return dispatch1(std::make_shared<Binary>(op), {a, b}, {shape, dt});
}

static Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  const char* name = binary_op_name(op);
  TESSERA_CHECK(a.defined(), "[", name, "] got an undefined tensor");
  check_float_or_int(name, a.dtype());
  DType dt = a.dtype();
  if (is_int(dt) && (!int_op_ok(op) || s != std::floor(s))) dt = DType::f32;
  return dispatch1(std::make_shared<BinaryScalar>(op, s, scalar_first), {a}, {a.shape(), dt});
}

Tensor binary(BinaryOp op, const Tensor& a, double s) {
  return binary_scalar(op, a, s, false);
}
Tensor binary(BinaryOp op, double s, const Tensor& a) {
  // Python's s / t is t.reciprocal() * s: the reciprocal is stored (rounded) first.
  if (op == BinaryOp::div)
    return binary_scalar(BinaryOp::mul, binary_scalar(op, a, 1.0, true), s, false);
  return binary_scalar(op, a, s, true);
}

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = unary_op_name(op);
  TESSERA_CHECK(x.defined(), "[", name, "] got an undefined tensor");
  check_float_or_int(name, x.dtype());
  DType dt = x.dtype();
  const bool int_ok =
      op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::square || op == UnaryOp::relu;
  if (is_int(dt) && !int_ok) dt = DType::f32;
  return dispatch1(std::make_shared<Unary>(op), {x}, {x.shape(), dt});
}

Tensor glu(const Tensor& x, UnaryOp act, bool gate_first) {
  TESSERA_CHECK(x.defined() && x.ndim() >= 1, "[glu] expected a tensor with at least one dim");
  TESSERA_CHECK(is_floating(x.dtype()), "[glu] expected a float tensor, got ", x.describe());
  TESSERA_CHECK(act == UnaryOp::silu || act == UnaryOp::gelu || act == UnaryOp::gelu_tanh,
                "[glu] activation ", unary_op_name(act), " not supported, expected silu or gelu");
  TESSERA_CHECK(x.shape().back() % 2 == 0, "[glu] last dim of ", shape_str(x.shape()),
                " is odd, expected an even size to split in halves");
  Shape shape = x.shape();
  shape.back() /= 2;
  return dispatch1(std::make_shared<Glu>(act, gate_first), {x}, {shape, x.dtype()});
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(cond.defined() && a.defined() && b.defined(), "[where] got an undefined tensor");
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  const DType dt = promote_types(a, b);
  TESSERA_CHECK(is_floating(dt), "[where] values are ", a.describe(), " and ", b.describe(),
                ", expected float tensors");
  return dispatch1(std::make_shared<Where>(), {cond, a, b}, {shape, dt});
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  // The scalar is made on the host: move it to x's device (where() needs one device).
  const Tensor v = Tensor::from_floats({float(value)}, {}, x.dtype()).to(x.device());
  const Tensor out = where(mask, v, x);
  TESSERA_CHECK(out.shape() == x.shape(), "[masked_fill] mask ", shape_str(mask.shape()),
                " does not broadcast to ", shape_str(x.shape()));
  return out;
}

namespace {
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

Fusion Binary::fusion(const std::vector<Tensor>& in) const {
  return in.size() == 2 ? Fusion::elementwise : Fusion::none;
}
void Binary::fused_instr(FusedInstr& instr, const std::vector<Tensor>&) const {
  instr.kind = FusedInstr::binary;
  instr.bop = op_;
}

Fusion BinaryScalar::fusion(const std::vector<Tensor>& in) const {
  return in.size() == 1 && op_ != BinaryOp::pow ? Fusion::elementwise : Fusion::none;
}
void BinaryScalar::fused_instr(FusedInstr& instr, const std::vector<Tensor>& in) const {
  instr.kind = FusedInstr::binary_scalar;
  instr.bop = op_;
  instr.scalar = scalar_as_torch(op_, scalar_, in[0].dtype(), instr.dtype);
  instr.scalar_first = scalar_first_;
}

Fusion Unary::fusion(const std::vector<Tensor>& in) const {
  return in.size() == 1 ? Fusion::elementwise : Fusion::none;
}
void Unary::fused_instr(FusedInstr& instr, const std::vector<Tensor>&) const {
  instr.kind = FusedInstr::unary;
  instr.uop = op_;
}

}  // namespace tessera
