// The row kernels of elementwise_loops.h built for the avx512 path (flags from CMake by file name).
#define EW_TABLE_NAME ew_kernels_avx512
#define EW_TABLE_ISA CpuIsa::avx512
#include "backends/cpu/elementwise_loops.h"
