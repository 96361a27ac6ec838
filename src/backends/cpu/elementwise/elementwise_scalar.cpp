// The row kernels of elementwise_loops.h built for the scalar path (flags from CMake by file name).
#define EW_TABLE_NAME ew_kernels_scalar
#define EW_TABLE_ISA CpuIsa::scalar
#include "backends/cpu/elementwise/elementwise_loops.h"
