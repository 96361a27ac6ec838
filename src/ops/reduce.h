// Reductions along one dim: sum, mean, var, max (torch.amax), argmax. Accumulation is in double
// (at least as exact as torch's fp32 cascade sums); bf16 results round once.
#pragma once
#include "runtime/primitive.h"

namespace tessera {

enum class ReduceOp : uint8_t { sum, mean, var, max, argmax };

class Reduce final : public Primitive {
 public:
  Reduce(ReduceOp op, int64_t dim, bool unbiased) : op_(op), dim_(dim), unbiased_(unbiased) {}
  const char* name() const override;
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;

  ReduceOp op() const { return op_; }
  int64_t dim() const { return dim_; }
  bool unbiased() const { return unbiased_; }

 private:
  ReduceOp op_;
  int64_t dim_;  // normalised, in the input
  bool unbiased_;
};

Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
// torch.var(x, dim, unbiased): divides by n - 1 when unbiased, by n otherwise.
Tensor var(const Tensor& x, int64_t dim, bool unbiased = true, bool keepdim = false);
// torch.amax(x, dim): NaN propagates.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
// torch.argmax(x, dim) -> i64, the first index of the maximum.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace tessera
