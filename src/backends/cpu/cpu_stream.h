// The CPU backend's stream: the ordered queue strict eager mode puts ops on. Asynchronous streams run ops
// on one host worker thread that feeds the OpenMP pool (decision 0006); blocking streams run
// each op at submit. Errors of queued ops surface at the next wait, naming the op.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/device.h"
#include "runtime/storage.h"

namespace tessera {

class Stream {
 public:
  explicit Stream(bool async);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Runs fn (queued when async) and returns its sequence number (1, 2, ...). `name` must
  // outlive the op (a primitive's name()).
  uint64_t submit(const char* name, std::function<void()> fn);
  // Blocks until op `seq` (and all before it) finished; throws a queued op's error, once.
  void wait(uint64_t seq);
  void synchronize();
  uint64_t completed() const { return completed_; }
  bool async() const { return async_ && !stopped_; }
  // Runs what is queued, then ends the worker; later ops run at submit. Called at exit, so
  // the worker never runs an op while static objects are being destroyed.
  void shutdown();
  // True on the worker thread (nested dispatches there run inline).
  static bool on_worker();

 private:
  struct Item {
    uint64_t seq;
    const char* name;
    std::function<void()> fn;
  };
  void run();
  void throw_error_locked(std::unique_lock<std::mutex>& lock);

  const bool async_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Item> queue_;
  uint64_t submitted_ = 0;
  std::atomic<uint64_t> completed_{0};
  std::string error_;  // first error since the last wait; later ops are skipped
  bool stop_ = false;
  std::atomic<bool> stopped_{false};
  std::thread worker_;
};

// The CPU device's stream. Asynchronous when async dispatch is on (modes.h) and
// TESSERA_LAUNCH_BLOCKING is not set.
Stream& cpu_stream();
// Host access to s: waits for the queued op that last uses it (no-op on the worker thread).
void wait_for_storage(const Storage& s);

}  // namespace tessera
