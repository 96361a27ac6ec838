// Softmax along one dimension, as torch.softmax: reduced-precision inputs compute in fp32 and
// round once on output.
#pragma once
#include "runtime/primitive.h"

namespace tessera {

class Softmax final : public Primitive {
 public:
  explicit Softmax(int64_t dim) : dim_(dim) {}
  const char* name() const override { return "softmax"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(dim_)); }
  bool equal_attributes(const Primitive& other) const override {
    return dim_ == static_cast<const Softmax&>(other).dim_;
  }

  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;  // normalised, >= 0
};

// exp(x - max) / sum(exp(x - max)) along `dim` (negative counts from the end); floating dtypes.
Tensor softmax(const Tensor& x, int64_t dim);

}  // namespace tessera
