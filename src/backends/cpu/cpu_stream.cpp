#include "backends/cpu/cpu_stream.h"

#include <omp.h>

#include <cstdlib>
#include <exception>

#include "runtime/error.h"
#include "runtime/modes.h"

namespace tessera {
namespace {
thread_local bool t_on_worker = false;
std::atomic<Stream*> g_async_stream{nullptr};
}  // namespace

Stream::Stream(bool async) : async_(async) {
  if (async_) worker_ = std::thread([this] { run(); });
}

Stream::~Stream() { shutdown(); }

void Stream::shutdown() {
  if (!async_ || stopped_ || on_worker()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  worker_.join();
  stopped_ = true;
}

// OpenMP threads of the worker's kernels count as the worker (they must never wait on it).
bool Stream::on_worker() {
  return t_on_worker || omp_in_parallel();
}

uint64_t Stream::submit(const char* name, std::function<void()> fn) {
  if (!async() || on_worker()) {
    // Blocking: the op's error reaches the caller at the op itself.
    fn();
    return 0;
  }
  uint64_t seq;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) {  // shutting down: the worker may be gone
      lock.unlock();
      fn();
      return 0;
    }
    seq = ++submitted_;
    queue_.push_back(Item{seq, name, std::move(fn)});
  }
  cv_work_.notify_one();
  return seq;
}

void Stream::run() {
  t_on_worker = true;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.empty();
    lock.unlock();
    std::string err;
    if (!skip) {
      try {
        item.fn();
      } catch (const std::exception& e) {
        err = e.what();
      } catch (...) {
        err = "unknown exception";
      }
    }
    item.fn = nullptr;  // release the op's tensors on this thread, outside the lock
    lock.lock();
    if (!err.empty() && error_.empty())
      error_ = detail::concat("[stream] queued op '", item.name, "' failed: ", err);
    completed_ = item.seq;
    cv_done_.notify_all();
  }
}

void Stream::throw_error_locked(std::unique_lock<std::mutex>& lock) {
  if (error_.empty()) return;
  std::string e = std::move(error_);
  error_.clear();
  throw Error(e);
}

void Stream::wait(uint64_t seq) {
  if (!async_ || on_worker()) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return completed_ >= seq; });
  throw_error_locked(lock);
}

void Stream::synchronize() {
  if (!async() || on_worker()) return;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = submitted_;
  }
  wait(seq);
}

Stream& cpu_stream() {
  // Never destroyed: tensors released at exit may still reference them.
  static Stream* blocking = new Stream(false);
  if (!async_dispatch() || launch_blocking()) return *blocking;
  static Stream* queued = [] {
    Stream* q = new Stream(true);
    g_async_stream = q;
    // Drain before the statics made before this point are destroyed (the CLI drains earlier).
    std::atexit([] { g_async_stream.load()->shutdown(); });
    return q;
  }();
  return *queued;
}

void wait_for_storage(const Storage& s) {
  const uint64_t seq = s.stream_seq.load(std::memory_order_acquire);
  if (seq == 0 || Stream::on_worker()) return;
  Stream* q = g_async_stream.load();
  if (q) q->wait(seq);  // also surfaces an error of any earlier queued op
}

}  // namespace tessera
