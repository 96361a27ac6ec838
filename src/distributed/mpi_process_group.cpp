// The MPI process group (decision 0040). Collectives are MPI's blocking ones on a duplicate of
// MPI_COMM_WORLD; failure detection is a watchdog thread exchanging heartbeats on a second
// duplicate: a rank that has not been heard from for the timeout is declared failed, and this
// rank prints that (naming it) and exits non-zero. A blocked collective on a live rank therefore
// never outlives a dead peer by more than the timeout.
// The C API only (OpenMPI's mpi.h would pull in its deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "distributed/process_group_backends.h"
#include "runtime/error.h"

namespace tessera::detail {

namespace {

constexpr int kHeartbeatTag = 7;
constexpr double kHeartbeatPeriod = 0.25;  // seconds between heartbeats to each peer

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void check_mpi(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  TESSERA_FAIL("[mpi] rank ", rank, ": ", what, " failed: ", std::string(text, size_t(len)));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i64:
      return MPI_INT64_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  explicit MpiProcessGroup(const ProcessGroupOptions& options) : timeout_(options.timeout_seconds) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread",
                -1);
      TESSERA_CHECK(provided == MPI_THREAD_MULTIPLE, "[mpi] the MPI library gives thread level ",
                    provided, "; tessera needs MPI_THREAD_MULTIPLE (collectives and the "
                    "heartbeat watchdog run on different threads)");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_dup(MPI_COMM_WORLD, &heartbeat_comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(heartbeat_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (size_ > 1) watchdog_ = std::thread([this] { watch(); });
  }

  ~MpiProcessGroup() override { stop_watchdog(); }

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t collectives() const override { return collectives_; }

  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    ++collectives_;
    if (dtype == DType::bf16) {  // summed in f32, rounded once
      auto* h = static_cast<uint16_t*>(data);
      std::vector<float> f(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) f[size_t(i)] = bf16_to_f32(h[i]);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, f.data(), int(count), MPI_FLOAT, MPI_SUM, comm_),
                "all_reduce", rank_);
      for (int64_t i = 0; i < count; ++i) h[i] = f32_to_bf16(f[size_t(i)]);
      return;
    }
    const MPI_Datatype t = mpi_type(dtype);
    TESSERA_CHECK(t != MPI_DATATYPE_NULL, "[all_reduce] dtype ", dtype_name(dtype),
                  " is not supported; expected f32, bf16 or i64");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, int(count), t, MPI_SUM, comm_), "all_reduce",
              rank_);
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    ++collectives_;
    check_mpi(MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, comm_),
              "all_gather", rank_);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ++collectives_;
    check_mpi(MPI_Bcast(data, int(bytes), MPI_BYTE, root, comm_), "broadcast", rank_);
  }

  void barrier() override {
    ++collectives_;
    check_mpi(MPI_Barrier(comm_), "barrier", rank_);
  }

  void finalize() {
    barrier();  // every rank is done with collectives: heartbeats may stop
    stop_watchdog();
    MPI_Barrier(heartbeat_comm_);
    drain_heartbeats(now_seconds());
    MPI_Comm_free(&heartbeat_comm_);
    MPI_Comm_free(&comm_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

 private:
  // Receives every heartbeat that has arrived, noting when each peer was last heard from.
  void drain_heartbeats(double now) {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kHeartbeatTag, heartbeat_comm_, &flag, &status) !=
              MPI_SUCCESS ||
          !flag)
        return;
      char byte;
      MPI_Recv(&byte, 1, MPI_BYTE, status.MPI_SOURCE, kHeartbeatTag, heartbeat_comm_,
               MPI_STATUS_IGNORE);
      if (status.MPI_SOURCE >= 0 && status.MPI_SOURCE < size_)
        last_heard_[size_t(status.MPI_SOURCE)] = now;
    }
  }

  void watch() {
    const double start = now_seconds();
    last_heard_.assign(size_t(size_), start);
    std::vector<MPI_Request> sends;
    const char byte = 1;
    double last_sent = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      const double now = now_seconds();
      if (now - last_sent >= kHeartbeatPeriod) {
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          MPI_Request r;
          if (MPI_Isend(&byte, 1, MPI_BYTE, p, kHeartbeatTag, heartbeat_comm_, &r) == MPI_SUCCESS)
            sends.push_back(r);
        }
        last_sent = now;
      }
      // Completed sends are dropped; one stuck behind a dead peer stays pending.
      for (size_t i = 0; i < sends.size();) {
        int done = 0;
        MPI_Test(&sends[i], &done, MPI_STATUS_IGNORE);
        if (done) {
          sends[i] = sends.back();
          sends.pop_back();
        } else {
          ++i;
        }
      }
      drain_heartbeats(now);
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || now - last_heard_[size_t(p)] <= timeout_) continue;
        std::fprintf(stderr,
                     "tessera: [rank %d] rank %d failed: no heartbeat from it for %.0f s "
                     "(TESSERA_TP_TIMEOUT); exiting\n",
                     rank_, p, timeout_);
        std::fflush(stderr);
        _exit(3);  // the collective this rank may be blocked in will never complete
      }
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    for (auto& r : sends) {  // unmatched small sends: give them up
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  MPI_Comm comm_ = MPI_COMM_NULL, heartbeat_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_;
  std::atomic<int64_t> collectives_{0};
  std::vector<double> last_heard_;
  std::thread watchdog_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options) {
  return std::make_shared<MpiProcessGroup>(options);
}

void finalize_mpi_process_group(ProcessGroup& group) {
  static_cast<MpiProcessGroup&>(group).finalize();
}

}  // namespace tessera::detail
