// Process memory and weight accounting for reports (docs/decisions/0011-offload.md): resident
// memory from /proc, the bytes of weights materialised at once, and bytes read from checkpoints.
#pragma once
#include <cstdint>
#include <string>

namespace tessera {

// Weights: parameter bytes made usable by a model (a zero-copy view of a memory map counts as
// materialised too: its pages are read when the model runs). Thread-safe counters.
void note_weights_materialised(int64_t bytes);
void note_weights_released(int64_t bytes);
// Checkpoint bytes read (a tensor's file range materialised or converted), counted once per use.
void note_checkpoint_read(int64_t bytes);
int64_t weight_bytes();       // materialised now
int64_t peak_weight_bytes();  // high-water mark since reset_peak_weight_bytes()
void reset_peak_weight_bytes();
int64_t checkpoint_read_bytes();  // since process start

// Resident set size (VmRSS) and its high-water mark (VmHWM); 0 where /proc is unavailable.
int64_t resident_bytes();
int64_t peak_resident_bytes();
// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs); false when not allowed.
bool reset_peak_resident();
// Bytes this process caused to be fetched from storage (/proc/self/io read_bytes): page-cache
// misses, mmap faults included.
int64_t storage_read_bytes();

// One stage's numbers (load, encode, denoise, decode or the whole run).
struct StageMemory {
  int64_t peak_device_bytes = 0;   // the execution device's allocator (on CPU: the host's)
  int64_t peak_host_bytes = 0;     // resident set high-water mark
  int64_t peak_alloc_bytes = 0;    // host allocator high-water mark
  int64_t peak_weight_bytes = 0;   // weights materialised at once
  int64_t disk_read_bytes = 0;     // checkpoint bytes read (note_checkpoint_read)
  int64_t storage_read_bytes = 0;  // bytes fetched from storage (/proc/self/io)
  // Folds a later stage into a total: peaks take the max, reads add up.
  void merge(const StageMemory& later);
  std::string json() const;  // {"peak_device_bytes": ..., ...}
};

// Measures one stage: the constructor resets every peak, finish() reads them.
class StageMemoryMeter {
 public:
  StageMemoryMeter();
  StageMemory finish() const;

 private:
  int64_t disk0_ = 0, storage0_ = 0;
};

}  // namespace tessera
