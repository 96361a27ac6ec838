#include "runtime/parallel.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "runtime/env.h"

namespace tessera {
namespace {
int initial_threads() {
  if (const auto n = env::integer(EnvVar::num_threads)) {
    omp_set_num_threads(int(*n));
    return int(*n);
  }
  return omp_get_max_threads();
}
int& thread_count() {
  static int n = initial_threads();
  return n;
}
}  // namespace

int num_threads() {
  return thread_count();
}

void set_num_threads(int n) {
  if (n < 1) n = 1;
  thread_count() = n;
  omp_set_num_threads(n);
}

int64_t min_parallel_work() {
  static const int64_t w = *env::integer(EnvVar::min_parallel_work);  // decision 0017
  return w;
}

int64_t grain_for_work(int64_t work_per_item) {
  return std::max<int64_t>(1, min_parallel_work() / std::max<int64_t>(work_per_item, 1));
}

void parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int threads = num_threads();
  if (n <= grain || threads == 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(threads) * 4);
  const int64_t step = (n + chunks - 1) / chunks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * step;
    const int64_t e = std::min(n, b + step);
    if (b < e) fn(b, e);
  }
}

}  // namespace tessera
