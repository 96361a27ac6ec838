// The backends built into tessera, one line each; the registry (runtime/backend.cpp) calls this
// at first use. An explicit list rather than static registrars: tessera_core is a static
// library, and the linker drops object files nothing references (decision 0020).
#include "backends/cpu/cpu_backend.h"

namespace tessera {

void register_builtin_backends() {
  register_backend(make_cpu_backend());
}

}  // namespace tessera
