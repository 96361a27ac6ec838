// The backends built into tessera, one line each; the registry (runtime/backend.cpp) calls this
// at first use. An explicit list rather than static registrars: tessera_core is a static
// library, and the linker drops object files nothing references (decision 0020).
#include "backends/cpu/cpu_backend.h"
#ifdef TESSERA_HAS_XLA
#include "backends/xla/xla_backend.h"
#endif

namespace tessera {

void register_builtin_backends() {
  register_backend(make_cpu_backend());
#ifdef TESSERA_HAS_XLA  // the PJRT header was found (scripts/setup_xla.sh; decision 0030)
  register_backend(make_xla_backend(DeviceType::xla));
  register_backend(make_xla_backend(DeviceType::tpu));
#endif
}

}  // namespace tessera
