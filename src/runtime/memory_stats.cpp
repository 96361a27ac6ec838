#include "runtime/memory_stats.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "runtime/backend.h"

namespace tessera {
namespace {

std::atomic<int64_t> g_weights{0}, g_weights_peak{0}, g_read{0};

void raise_peak(std::atomic<int64_t>& peak, int64_t v) {
  int64_t p = peak.load();
  while (v > p && !peak.compare_exchange_weak(p, v)) {
  }
}

// A "Key:   123 kB" line of /proc/self/<file>, in bytes (kB lines) or as is.
int64_t proc_value(const char* file, const char* key) {
  std::FILE* f = std::fopen(file, "r");
  if (!f) return 0;
  char line[256];
  int64_t v = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) != 0 || line[n] != ':') continue;
    long long x = 0;
    char unit[8] = {};
    const int got = std::sscanf(line + n + 1, "%lld %7s", &x, unit);
    v = got == 2 && std::strcmp(unit, "kB") == 0 ? x * 1024 : x;
    break;
  }
  std::fclose(f);
  return v;
}

}  // namespace

void note_weights_materialised(int64_t bytes) {
  raise_peak(g_weights_peak, g_weights += bytes);
}
void note_weights_released(int64_t bytes) {
  g_weights -= bytes;
}
void note_checkpoint_read(int64_t bytes) {
  g_read += bytes;
}
int64_t weight_bytes() {
  return g_weights.load();
}
int64_t peak_weight_bytes() {
  return g_weights_peak.load();
}
void reset_peak_weight_bytes() {
  g_weights_peak = g_weights.load();
}
int64_t checkpoint_read_bytes() {
  return g_read.load();
}

int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, rss = 0;
  const int got = std::fscanf(f, "%lld %lld", &size, &rss);
  std::fclose(f);
  return got == 2 ? rss * int64_t(sysconf(_SC_PAGESIZE)) : 0;
}

int64_t peak_resident_bytes() {
  return proc_value("/proc/self/status", "VmHWM");
}

bool reset_peak_resident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

int64_t storage_read_bytes() {
  return proc_value("/proc/self/io", "read_bytes");
}

void StageMemory::merge(const StageMemory& s) {
  peak_device_bytes = std::max(peak_device_bytes, s.peak_device_bytes);
  peak_host_bytes = std::max(peak_host_bytes, s.peak_host_bytes);
  peak_alloc_bytes = std::max(peak_alloc_bytes, s.peak_alloc_bytes);
  peak_weight_bytes = std::max(peak_weight_bytes, s.peak_weight_bytes);
  disk_read_bytes += s.disk_read_bytes;
  storage_read_bytes += s.storage_read_bytes;
}

std::string StageMemory::json() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"peak_device_bytes\": %lld, \"peak_host_bytes\": %lld, \"peak_alloc_bytes\": "
                "%lld, \"peak_weight_bytes\": %lld, \"disk_read_bytes\": %lld, "
                "\"storage_read_bytes\": %lld}",
                (long long)peak_device_bytes, (long long)peak_host_bytes,
                (long long)peak_alloc_bytes, (long long)peak_weight_bytes,
                (long long)disk_read_bytes, (long long)storage_read_bytes);
  return buf;
}

StageMemoryMeter::StageMemoryMeter() {
  for (Backend* b : backends())
    for (const Device& d : b->started_devices()) b->allocator(d).reset_peak();
  reset_peak_weight_bytes();
  reset_peak_resident();
  disk0_ = checkpoint_read_bytes();
  storage0_ = storage_read_bytes();
}

StageMemory StageMemoryMeter::finish() const {
  StageMemory s;
  // Summed over devices (the CPU's counters are the host's).
  for (Backend* b : backends())
    for (const Device& d : b->started_devices()) s.peak_alloc_bytes += b->allocator(d).stats().peak_bytes;
  s.peak_device_bytes = s.peak_alloc_bytes;
  // Without clear_refs the high-water mark covers the whole process; the current RSS bounds it.
  s.peak_host_bytes = std::max(peak_resident_bytes(), resident_bytes());
  s.peak_weight_bytes = peak_weight_bytes();
  s.disk_read_bytes = checkpoint_read_bytes() - disk0_;
  s.storage_read_bytes = storage_read_bytes() - storage0_;
  return s;
}

}  // namespace tessera
