// The CPU backend: host memory (CpuAllocator), the host stream (cpu_stream.h), and each
// primitive's eval_cpu / prepare_cpu, the reference implementations (src/backends/cpu/*/).
#pragma once
#include <memory>

#include "runtime/backend.h"

namespace tessera {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace tessera
