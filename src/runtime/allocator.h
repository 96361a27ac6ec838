// One allocator per device with block reuse and byte counters (current, peak).
#pragma once
#include <cstddef>
#include <cstdint>

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
  // What a request of `bytes` occupies (its size class): static memory plans share a buffer
  // between values of one block size.
  virtual size_t block_size(size_t bytes) const { return bytes; }
};

// The CPU device's allocator, for callers outside the runtime (tests, the CLI's memory report);
// the runtime itself asks backend_for(device).allocator(device). Defined in backends/cpu.
Allocator& cpu_allocator();

}  // namespace tessera
