// The CPU backend's allocator: 64-byte aligned host blocks; sizes are rounded to size classes
// and freed blocks are kept per class, so the same shapes every denoising step reuse the same
// memory.
#pragma once
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/allocator.h"

namespace tessera {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  ~CpuAllocator() override;

  size_t block_size(size_t bytes) const override { return size_class(bytes); }
  static size_t size_class(size_t bytes);

 private:
  void release_cached_locked();
  mutable std::mutex mu_;
  // Size class -> freed blocks (a vector per class: no node allocation per free, LIFO reuse).
  std::unordered_map<size_t, std::vector<void*>> free_;
  MemoryStats stats_;
};

}  // namespace tessera
