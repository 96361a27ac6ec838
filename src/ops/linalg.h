// Matrix products: matmul (torch.matmul) and linear (torch.nn.functional.linear). The CPU
// kernels run on oneDNN (docs/decisions/0002-gemm-library.md); bf16 inputs accumulate in fp32
// and round the output to bf16 once, as PyTorch's CPU path does.
#pragma once
#include <cstddef>
#include <cstdint>

#include "runtime/primitive.h"

namespace tessera {

// a[..., M, K] @ b[..., K, N] -> [broadcast(...), M, N]. Batch dims of size 1 (or missing) on
// either side broadcast. Either matrix may be a transposed view; no copy is made for it.
class Matmul final : public Primitive {
 public:
  const char* name() const override { return "matmul"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
};

// x[M, K] @ weight[N, K]^T (+ bias[N]) -> [M, N]. The weight is assumed immutable (checkpoint
// memory) and is repacked once into the kernel library's layout and cached.
class Linear final : public Primitive {
 public:
  explicit Linear(bool has_bias) : has_bias_(has_bias) {}
  const char* name() const override { return "linear"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override { h.add(has_bias_); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const Linear&>(o).has_bias_ == has_bias_;
  }
  bool has_bias() const { return has_bias_; }
  std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& in,
                                              const std::vector<Tensor>& out) override;

 private:
  bool has_bias_;
};

// torch.matmul for inputs of at least one dimension (1-D operands are promoted and the added
// dimension removed from the result). Both inputs must have the same floating dtype (f32, bf16).
Tensor matmul(const Tensor& a, const Tensor& b);
// torch.nn.functional.linear: x[..., in] with weight[out, in] and optional bias[out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Kernel-library caches shared by the GEMM and convolution kernels.
struct KernelCacheStats {
  int64_t primitive_hits = 0;    // calls that reused a created oneDNN primitive
  int64_t primitive_misses = 0;  // primitives created
  int64_t packed_hits = 0;       // calls that reused a repacked weight
  int64_t packed_misses = 0;     // weights repacked
  int64_t packed_entries = 0;    // repacked weights held now
  size_t packed_bytes = 0;       // bytes they occupy
};
KernelCacheStats kernel_cache_stats();
// Drops every cached primitive and repacked weight (call after modifying a weight in place, or
// to return the memory, e.g. when a model is offloaded).
void clear_kernel_caches();
// Upper bound for repacked weights, in bytes (default a third of physical memory, at least 4 GiB,
// or TESSERA_PACKED_WEIGHT_CACHE_MB); least recently used entries are evicted beyond it.
void set_packed_weight_cache_capacity(size_t bytes);

}  // namespace tessera
