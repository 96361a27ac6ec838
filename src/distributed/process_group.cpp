#include "distributed/process_group.h"

#include <cstdlib>
#include <fstream>
#include <mutex>

#include "distributed/process_group_backends.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace tessera {

namespace {
std::mutex g_mutex;
std::shared_ptr<ProcessGroup> g_default;
}  // namespace

bool mpi_available() {
#ifdef TESSERA_HAS_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpirun() {
  // OpenMPI's launcher sets these in every rank's environment.
  const char* size = env::raw("OMPI_COMM_WORLD_SIZE");
  return size && std::atoi(size) > 1;
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 const ProcessGroupOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TESSERA_CHECK(backend == "mpi", "[init_process_group] unknown backend '", backend,
                "'; expected mpi");
  if (g_default) return g_default;
#ifdef TESSERA_HAS_MPI
  ProcessGroupOptions opt = options;
  if (env::is_set(EnvVar::tp_timeout)) opt.timeout_seconds = double(*env::integer(EnvVar::tp_timeout));
  g_default = detail::make_mpi_process_group(opt);
  return g_default;
#else
  TESSERA_FAIL("[init_process_group] this build of tessera has no MPI backend (OpenMPI was not "
               "found when it was configured; scripts/setup.sh installs it)");
#endif
}

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_default;
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_default) return;
#ifdef TESSERA_HAS_MPI
  detail::finalize_mpi_process_group(*g_default);  // after a barrier: every rank got here
#endif
  // tessera launch: mpirun --enable-recovery exits 0 whatever its ranks did, so rank 0 tells
  // it that every rank finished.
  if (g_default->rank() == 0 && env::is_set(EnvVar::launch_dir))
    std::ofstream(env::string(EnvVar::launch_dir) + "/done") << "ok\n";
  g_default.reset();
}

}  // namespace tessera
