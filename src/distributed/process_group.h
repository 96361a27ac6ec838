// ProcessGroup: collectives among the processes of one run (torch.distributed's process group).
// init_process_group("mpi") joins the processes that mpirun (tessera launch) started; every
// collective is entered by every rank in the same order. A rank that dies or stops answering is
// detected by a heartbeat watchdog: every rank then exits non-zero naming it (decision 0040).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/dtype.h"

namespace tessera {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual std::string backend() const = 0;  // "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place, elementwise sum over every rank (f32, i64; bf16 is summed in f32 and rounded once).
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  // recv (size() * bytes) = every rank's send (bytes), in rank order.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // root's bytes into every rank's data.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Collectives run so far (the same on every rank that runs the same program).
  virtual int64_t collectives() const = 0;
};

struct ProcessGroupOptions {
  // A rank whose heartbeat has not arrived for this long is declared failed (TESSERA_TP_TIMEOUT
  // overrides, in seconds).
  double timeout_seconds = 10.0;
};

// Starts the default (world) group. backend "mpi": the processes mpirun started (a process not
// started by mpirun is a world of one). Calling it again returns the same group; another backend
// name, or "mpi" in a build without MPI, is an error.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 const ProcessGroupOptions& options = {});
// The group init_process_group started, or null.
std::shared_ptr<ProcessGroup> default_process_group();
// Waits for every rank, stops the watchdog and leaves the group (torch's destroy_process_group).
void destroy_process_group();
// True when this build has the MPI backend.
bool mpi_available();
// True when this process was started by mpirun with more than one rank (before any init).
bool launched_by_mpirun();

}  // namespace tessera
