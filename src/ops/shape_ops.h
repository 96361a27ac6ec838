// Shape ops that move data: concat and constant pad (copies), split and chunk (views).
#pragma once
#include <vector>

#include "runtime/primitive.h"

namespace tessera {

// torch.cat along `dim`; dtypes promote as torch (bf16 with f32 gives f32).
class Concat final : public Primitive {
 public:
  explicit Concat(int64_t dim) : dim_(dim) {}
  const char* name() const override { return "concat"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(dim_)); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const Concat&>(o).dim_ == dim_;
  }

  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;  // normalised
};

// F.pad(x, pads, mode="constant", value): pads lists (before, after) pairs from the last dim
// backwards; negative entries crop.
class Pad final : public Primitive {
 public:
  Pad(std::vector<int64_t> pads, double value) : pads_(std::move(pads)), value_(value) {}
  const char* name() const override { return "pad"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override;
  bool equal_attributes(const Primitive& o) const override;

  const std::vector<int64_t>& pads() const { return pads_; }
  double value() const { return value_; }

 private:
  std::vector<int64_t> pads_;
  double value_;
};

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
// torch.split with explicit sizes (must sum to the dim size): views, no copy.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// torch.split(x, size, dim): pieces of `size`, the last one shorter. Views.
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim);
// torch.chunk: pieces of ceil(n / chunks) (so possibly fewer than `chunks`). Views.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);

}  // namespace tessera
