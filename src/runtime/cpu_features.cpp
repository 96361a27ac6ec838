#include "runtime/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <initializer_list>
#include <cstring>
#include <string>

#include "runtime/env.h"

namespace tessera {
namespace {

bool os_saves_zmm() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6) == 0xe6;
}

bool os_saves_ymm() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6) == 0x6;
}

// Linux hands out AMX tile state only to processes that ask (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA); without it the first tile instruction faults.
bool os_grants_amx() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuIsa detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return CpuIsa::scalar;
  const bool fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return CpuIsa::scalar;
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const bool bf16 = a1 & (1u << 5);
  if (!(avx2 && fma && f16c && os_saves_ymm())) return CpuIsa::scalar;
  if (!(avx512f && avx512dq && avx512bw && avx512vl && os_saves_zmm())) return CpuIsa::avx2;
  if (!bf16) return CpuIsa::avx512;
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  return amx_bf16 && amx_tile && os_grants_amx() ? CpuIsa::amx_bf16 : CpuIsa::avx512_bf16;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx512_bf16: return "avx512_bf16";
    case CpuIsa::amx_bf16: return "amx_bf16";
  }
  return "?";
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = [] {
    CpuIsa best = detect();
    const std::string cap = env::choice(EnvVar::cpu_isa);
    for (CpuIsa c : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16,
                     CpuIsa::amx_bf16}) {
      if (cap == cpu_isa_name(c) && c < best) best = c;
    }
    return best;
  }();
  return isa;
}

}  // namespace tessera
