// CPU features read at run time, so one binary picks the best kernels on each machine.
#pragma once

namespace tessera {

enum class CpuIsa { scalar = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };

// The best ISA level this CPU supports, capped by TESSERA_CPU_ISA=scalar|avx2|avx512|avx512_bf16
// (to test every kernel path on one machine).
CpuIsa cpu_isa();
const char* cpu_isa_name(CpuIsa isa);

}  // namespace tessera
