// The one thread pool every kernel shares. It is the OpenMP runtime, which oneDNN also uses, so
// GEMMs and our own kernels never compete with a second set of spinning threads.
#pragma once
#include <cstdint>
#include <functional>

namespace tessera {

// Threads used by kernels: TESSERA_NUM_THREADS if set, else the number of cores.
int num_threads();
void set_num_threads(int n);

// Runs fn(begin, end) over [0, n) split into chunks of at least `grain` items, in parallel.
// Runs inline when n <= grain or when already inside a parallel region.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tessera
