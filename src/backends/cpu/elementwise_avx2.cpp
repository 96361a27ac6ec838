// The row kernels of elementwise_loops.h built for the avx2 path (flags from CMake by file name).
#define EW_TABLE_NAME ew_kernels_avx2
#define EW_TABLE_ISA CpuIsa::avx2
#include "backends/cpu/elementwise_loops.h"
