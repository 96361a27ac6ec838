// The backends behind init_process_group (process_group.cpp). Only this layer includes it.
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace tessera::detail {

#ifdef TESSERA_HAS_MPI
// MPI_Init_thread (MPI_THREAD_MULTIPLE: kernels run collectives on the stream's thread while the
// watchdog's thread exchanges heartbeats) and the world group.
std::shared_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options);
// Barrier, watchdog stopped, MPI_Finalize.
void finalize_mpi_process_group(ProcessGroup& group);
#endif

}  // namespace tessera::detail
