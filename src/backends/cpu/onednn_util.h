// oneDNN plumbing shared by the CPU GEMM and convolution kernels: the engine and stream, dtype
// and view mapping, a cache of created primitives keyed by shapes/dtypes, and the cache of
// weights repacked into oneDNN's blocked layouts.
#pragma once
#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "runtime/tensor.h"

namespace tessera::onednn {

dnnl::engine& engine();
dnnl::stream& stream();
// oneDNN runs on the OpenMP runtime: make its parallel regions on this thread use num_threads().
void sync_threads();
void sync_threads(int n);
// Threads for a GEMM of `macs` multiply-adds: one below min_parallel_work(), else num_threads().
// Set with sync_threads(n) both when its primitive is made (oneDNN fixes its split then) and run.
int gemm_threads(int64_t macs);

// oneDNN's own ("library") scratchpad is a per-thread buffer sized as primitives are made on that
// thread, so a primitive run on another thread (the async stream's worker) gets a buffer that is
// null or too small. Make primitives with user_scratchpad() and pass scratchpad(its desc) as
// DNNL_ARG_SCRATCHPAD: the running thread's buffer, kept and grown when too small.
dnnl::primitive_attr user_scratchpad();
dnnl::memory scratchpad(const dnnl::memory::desc& md);

dnnl::memory::data_type data_type(DType t, const char* op);
// Whether oneDNN has bf16 matmul kernels on this CPU (2.6: from AVX-512 on). Without them bf16
// products run as f32 products on converted operands, rounded where the bf16 kernel rounds.
bool has_bf16_matmul();
// Memory descriptor for a materialised view (its shape and element strides). Size-1 dims get a
// harmless stride, since oneDNN rejects some of the strides views may carry there.
dnnl::memory::desc view_desc(const Tensor& t, const char* op);
// The same view re-shaped (for grouped weights and folded batches); `dims` must match numel.
dnnl::memory::desc view_desc(const Shape& dims, const Strides& strides, DType t, const char* op);
inline dnnl::memory wrap(const dnnl::memory::desc& md, const Tensor& t) {
  return dnnl::memory(md, engine(), t.raw_data());
}

// Builds cache keys from shapes, strides and flags.
class KeyBuilder {
 public:
  KeyBuilder& add(int64_t v) {
    s_ += std::to_string(v);
    s_ += ',';
    return *this;
  }
  KeyBuilder& add(const std::vector<int64_t>& v);
  KeyBuilder& add(const Tensor& t);  // dtype, shape, strides (not the data)
  KeyBuilder& add(const char* tag) {
    s_ += tag;
    s_ += '|';
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

// Counters kept by the caches (reported by tessera::kernel_cache_stats()).
void count_primitive(bool hit);

// Created primitives by key. Bounded: when full it starts over (shapes in a pipeline are few).
template <typename Entry>
class PrimitiveCache {
 public:
  template <typename Make>
  std::shared_ptr<Entry> get(const std::string& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      count_primitive(true);
      return it->second;
    }
    count_primitive(false);
    if (map_.size() >= kCapacity) map_.clear();
    auto e = std::make_shared<Entry>(make());
    map_.emplace(key, e);
    return e;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
  }

 private:
  static constexpr size_t kCapacity = 512;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> map_;
};

// Registers a cache's clear function with tessera::clear_kernel_caches().
void register_cache_clear(void (*fn)());

// `w` (whose view is described by `user_md`) in the layout `packed_md`. Cached by the weight's
// storage, offset, shape, strides and dtype plus the target layout; the entry dies with the
// storage (a weak reference), so a new tensor at a reused address never hits a stale copy.
dnnl::memory packed_weights(const Tensor& w, const dnnl::memory::desc& user_md,
                            const dnnl::memory::desc& packed_md);
// A reorder into a fresh buffer, uncached (for weights that are not checkpoint memory).
dnnl::memory reorder_to(const dnnl::memory& src, const dnnl::memory::desc& md);

}  // namespace tessera::onednn
