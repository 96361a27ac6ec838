// The one thread pool every kernel shares. It is the OpenMP runtime, which oneDNN also uses, so
// GEMMs and our own kernels never compete with a second set of spinning threads.
#pragma once
#include <cstdint>
#include <memory>
#include <type_traits>

namespace tessera {

// Threads used by kernels: TESSERA_NUM_THREADS if set, else the number of cores.
int num_threads();
void set_num_threads(int n);

// Multiply-adds (or element operations of like cost) below which a kernel stays on the calling
// thread: an OpenMP fork and join costs microseconds, and splitting less work than this saves less
// than that (measured on the tiny FLUX step with two threads: docs/decisions/0017).
int64_t min_parallel_work();
// The parallel_for grain for items of `work_per_item` each: at least min_parallel_work() per chunk.
int64_t grain_for_work(int64_t work_per_item);

// A non-owning reference to a callable fn(begin, end): every kernel passes a lambda per call, and
// std::function would heap-allocate the lambda's captures each time (it only lives for the call).
class RangeFn {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT: implicit, so lambdas convert at the call
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, int64_t b, int64_t e) {
          (*static_cast<std::remove_reference_t<F>*>(o))(b, e);
        }) {}
  void operator()(int64_t b, int64_t e) const { call_(obj_, b, e); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};

// Runs fn(begin, end) over [0, n) split into chunks of at least `grain` items, in parallel.
// Runs inline when n <= grain or when already inside a parallel region.
void parallel_for(int64_t n, int64_t grain, RangeFn fn);

}  // namespace tessera
