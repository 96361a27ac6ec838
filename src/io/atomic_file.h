// write_file_atomically moved to the runtime (the compiled-mode plan cache writes with it).
#pragma once
#include "runtime/atomic_file.h"
