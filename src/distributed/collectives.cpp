#include "distributed/collectives.h"

#include <cstring>

#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {

namespace {

// out = sum over ranks of in (in: contiguous, same shape and dtype).
class AllReduce final : public Primitive {
 public:
  explicit AllReduce(std::shared_ptr<ProcessGroup> g) : group_(std::move(g)) {}
  const char* name() const override { return "all_reduce"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    std::memcpy(out[0].raw_data(), in[0].raw_data(), in[0].nbytes());
    group_->all_reduce_sum(out[0].raw_data(), out[0].numel(), out[0].dtype());
  }
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(group_->size())); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const AllReduce&>(o).group_ == group_;
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// out (size, *in.shape) = every rank's in, stacked in rank order.
class AllGather final : public Primitive {
 public:
  explicit AllGather(std::shared_ptr<ProcessGroup> g) : group_(std::move(g)) {}
  const char* name() const override { return "all_gather"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    group_->all_gather(in[0].raw_data(), out[0].raw_data(), in[0].nbytes());
  }
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(group_->size())); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const AllGather&>(o).group_ == group_;
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

void check_cpu(const Tensor& x, const char* op) {
  TESSERA_CHECK(x.defined(), "[", op, "] the input is undefined");
  TESSERA_CHECK(x.device().type == DeviceType::cpu, "[", op, "] runs on CPU tensors; got one on ",
                x.device().str());
}

}  // namespace

Tensor all_reduce(const Tensor& x, const std::shared_ptr<ProcessGroup>& group) {
  check_cpu(x, "all_reduce");
  TESSERA_CHECK(group, "[all_reduce] no process group");
  if (group->size() == 1) return x;
  return dispatch1(std::make_shared<AllReduce>(group), {contiguous(x)}, {x.shape(), x.dtype()});
}

Tensor all_gather(const Tensor& x, int64_t dim, const std::shared_ptr<ProcessGroup>& group) {
  check_cpu(x, "all_gather");
  TESSERA_CHECK(group, "[all_gather] no process group");
  if (group->size() == 1) return x;
  dim = normalize_dim(dim, x.ndim(), "all_gather");
  Shape stacked = x.shape();
  stacked.insert(stacked.begin(), group->size());
  const Tensor g =
      dispatch1(std::make_shared<AllGather>(group), {contiguous(x)}, {stacked, x.dtype()});
  // (N, ..., d, ...) -> (..., N, d, ...) -> (..., N * d, ...)
  std::vector<int64_t> order;
  for (int64_t i = 1; i <= x.ndim(); ++i) {
    if (i - 1 == dim) order.push_back(0);
    order.push_back(i);
  }
  Shape shape = x.shape();
  shape[size_t(dim)] *= group->size();
  return contiguous(g.permute(order)).view(shape);
}

}  // namespace tessera
