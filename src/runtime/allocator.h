// One allocator per device with block reuse and byte counters (current, peak).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace tessera {

struct MemoryStats {
  int64_t current_bytes = 0;  // handed out and not yet freed
  int64_t peak_bytes = 0;     // high-water mark of current_bytes since the last reset
  int64_t cached_bytes = 0;   // freed blocks kept for reuse
  int64_t alloc_count = 0;    // allocations served (reused or fresh)
  int64_t reuse_count = 0;    // allocations served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Return cached blocks to the system.
  virtual void empty_cache() = 0;
};

// Host allocator: 64-byte aligned blocks; sizes are rounded to size classes and freed blocks
// are kept per class, so the same shapes every denoising step reuse the same memory.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  ~CpuAllocator() override;

  static size_t size_class(size_t bytes);

 private:
  void release_cached_locked();
  mutable std::mutex mu_;
  // Size class -> freed blocks (a vector per class: no node allocation per free, LIFO reuse).
  std::unordered_map<size_t, std::vector<void*>> free_;
  MemoryStats stats_;
};

Allocator& cpu_allocator();

}  // namespace tessera
