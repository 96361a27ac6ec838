// A block of device memory: owned (from the device allocator) or borrowed (an mmapped file
// region kept alive by `keepalive`).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device.h"

namespace tessera {

struct StorageSharding;

class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t nbytes, const Device& device);
  static std::shared_ptr<Storage> borrow(void* data, size_t nbytes, const Device& device,
                                         std::shared_ptr<const void> keepalive);
  ~Storage();
  // Only for allocate/borrow (make_shared needs a public constructor: one allocation, not two).
  struct Token {
   private:
    friend class Storage;
    Token() = default;
  };
  explicit Storage(Token) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  bool owned() const { return !keepalive_; }

  // The last op queued on the asynchronous stream that reads or writes this block (0: none);
  // host access waits for it (runtime/stream.h).
  std::atomic<uint64_t> stream_seq{0};

  // SPMD (runtime/sharding.h, decision 0060): set when this device storage's bytes live split
  // over several devices of its backend, before they are written; null: whole.
  std::shared_ptr<const StorageSharding> sharding;

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<const void> keepalive_;
};

}  // namespace tessera
