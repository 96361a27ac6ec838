#include "backends/cpu/cpu_allocator.h"

#include <cstdlib>
#include <new>

#include "runtime/error.h"

namespace tessera {

size_t CpuAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  bytes = (bytes + 63) & ~size_t(63);
  if (bytes <= 4096) return bytes;
  // Above 4 KiB: 8 classes per power of two, so waste stays below 12.5%.
  size_t p = 4096;
  while (p * 2 < bytes) p *= 2;
  const size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

void* CpuAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= int64_t(cls);
    stats_.reuse_count++;
  } else {
    p = std::aligned_alloc(64, cls);
    if (!p && stats_.cached_bytes > 0) {  // out of memory: give back the cache and retry
      release_cached_locked();
      stats_.cached_bytes = 0;
      p = std::aligned_alloc(64, cls);
    }
    TESSERA_CHECK(p, "[allocator] out of memory allocating ", bytes, " bytes on cpu (",
                  stats_.current_bytes, " bytes in use)");
  }
  stats_.alloc_count++;
  stats_.current_bytes += int64_t(cls);
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.current_bytes -= int64_t(cls);
  stats_.cached_bytes += int64_t(cls);
  free_[cls].push_back(p);
}

MemoryStats CpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CpuAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CpuAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
  stats_.cached_bytes = 0;
}

void CpuAllocator::release_cached_locked() {
  for (auto& [sz, blocks] : free_)
    for (void* blk : blocks) std::free(blk);
  free_.clear();
}

CpuAllocator::~CpuAllocator() {
  empty_cache();
}

Allocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: tensors may outlive main
  return *a;
}

}  // namespace tessera
