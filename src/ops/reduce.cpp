#include "ops/reduce.h"

#include "runtime/error.h"

namespace tessera {

const char* Reduce::name() const {
  switch (op_) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::var:
      return "var";
    case ReduceOp::max:
      return "max";
    case ReduceOp::argmax:
      return "argmax";
  }
  return "reduce";
}

void Reduce::hash_attributes(Hasher& h) const {
  h.add(uint64_t(op_));
  h.add(uint64_t(dim_));
  h.add(unbiased_);
}

bool Reduce::equal_attributes(const Primitive& o) const {
  const auto& r = static_cast<const Reduce&>(o);
  return r.op_ == op_ && r.dim_ == dim_ && r.unbiased_ == unbiased_;
}

namespace {

Tensor reduce(ReduceOp op, const char* name, const Tensor& x, int64_t dim, bool keepdim,
              bool unbiased) {
  TESSERA_CHECK(x.defined(), "[", name, "] got an undefined input");
  TESSERA_CHECK(x.ndim() >= 1, "[", name, "] input has shape ", shape_str(x.shape()),
                ", expected at least one dim to reduce");
  const DType t = x.dtype();
  const bool int_in = t == DType::i64 || t == DType::i32;
  TESSERA_CHECK(is_floating(t) || (int_in && (op == ReduceOp::sum || op == ReduceOp::max ||
                                              op == ReduceOp::argmax)),
                "[", name, "] unsupported input ", x.describe(), ", expected a float tensor",
                (op == ReduceOp::sum || op == ReduceOp::max) ? " or an integer one" : "");
  const int64_t d = normalize_dim(dim, x.ndim(), name);
  TESSERA_CHECK(
      x.shape()[d] > 0 || op == ReduceOp::sum || op == ReduceOp::mean || op == ReduceOp::var, "[",
      name, "] cannot reduce an empty dim ", d, " of ", shape_str(x.shape()));
  Shape out = x.shape();
  if (keepdim)
    out[d] = 1;
  else
    out.erase(out.begin() + d);
  DType ot = t;
  if (op == ReduceOp::argmax || (op == ReduceOp::sum && int_in)) ot = DType::i64;
  return dispatch1(std::make_shared<Reduce>(op, d, unbiased), {x}, {out, ot});
}

}  // namespace

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce(ReduceOp::sum, "sum", x, dim, keepdim, false);
}
Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce(ReduceOp::mean, "mean", x, dim, keepdim, false);
}
Tensor var(const Tensor& x, int64_t dim, bool unbiased, bool keepdim) {
  return reduce(ReduceOp::var, "var", x, dim, keepdim, unbiased);
}
Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce(ReduceOp::max, "max", x, dim, keepdim, false);
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce(ReduceOp::argmax, "argmax", x, dim, keepdim, false);
}

}  // namespace tessera
