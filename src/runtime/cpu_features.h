// CPU features read at run time, so one binary picks the best kernels on each machine.
#pragma once

namespace tessera {

// amx_bf16: AVX-512-BF16 plus AMX tiles (TMUL bf16) with the OS's permission to use them.
enum class CpuIsa { scalar = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, amx_bf16 = 4 };

// The best ISA level this CPU supports, capped by
// TESSERA_CPU_ISA=scalar|avx2|avx512|avx512_bf16|amx_bf16
// (to test every kernel path on one machine).
CpuIsa cpu_isa();
const char* cpu_isa_name(CpuIsa isa);

}  // namespace tessera
