// The seam between the runtime and a device. The runtime (dispatch, storage, the deferred and
// compiled executors) never names a device type: it asks the backend of the tensor's device.
// Backends live in src/backends/<name>/ and are listed in src/backends/register_backends.cpp.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/primitive.h"

namespace tessera {

// A whole plan (a deferred segment, a compiled program) as one kernel, for backends that compile
// graphs (XLA: one executable per segment or program instead of one per op).
struct GraphStep {
  Primitive* prim = nullptr;
  std::vector<Tensor> ins, outs;  // the recorded views; an input's storage is set for constants
  std::vector<int64_t> in_value;  // per input: the flat value it reads, or -1
  std::vector<int64_t> in_ext;    // per input: the external input it reads, or -1 (constant)
  std::vector<int64_t> out_value;  // per output: its flat value
};
class GraphKernel {
 public:
  virtual ~GraphKernel() = default;
  // ext: the external inputs' storages; ext_offset (or null: 0) adds to their recorded view
  // offsets. Sets values[v] for every value the plan does not release.
  virtual void run(const std::vector<std::shared_ptr<Storage>>& ext,
                   const std::vector<int64_t>* ext_offset,
                   std::vector<std::shared_ptr<Storage>>& values) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu"
  virtual DeviceType device_type() const = 0;
  // Devices of this type usable on this machine (empty: built, but no device found).
  virtual std::vector<Device> devices() const = 0;
  // The devices already started (a plugin loaded, a context created). Whole-process sweeps
  // (waits, memory counters) visit only these, so a CPU run never starts another device.
  virtual std::vector<Device> started_devices() const { return devices(); }
  // Why `d` is not among devices() ("" when unknown): require_available adds it to its error.
  virtual std::string why_unavailable(const Device& /*d*/) const { return ""; }

  // Memory: the device's caching allocator (its counters feed memory_stats.h).
  virtual Allocator& allocator(const Device& d) = 0;
  // Copies between host memory and a device storage (byte offsets into the storage).
  virtual void copy_to_host(const Storage& src, size_t offset, void* dst, size_t bytes) = 0;
  virtual void copy_from_host(const void* src, Storage& dst, size_t offset, size_t bytes) = 0;

  // Stream and events. synchronize: wait for all queued work on `d`, throwing the error of a
  // queued op that failed. wait_for: host access to `s` waits for the op that last used it.
  // on_kernel_thread: true where this backend's kernels run (ops they dispatch run inline).
  virtual void synchronize(const Device& d) = 0;
  virtual void wait_for(const Storage& s) = 0;
  virtual bool on_kernel_thread() const = 0;

  // Kernels. supports: can `p` run here on inputs and outputs of these dtypes (fused kernels
  // are only formed for devices that support them). launch: strict eager, put the op on the
  // device's stream (outs are allocated). run: now, on the calling thread (inside a deferred
  // segment or compiled program). prepare: a kernel set up once for these fixed views
  // (compiled programs, cached segments), or null to run() each time.
  virtual bool supports(const Primitive& p, const std::vector<DType>& dtypes) const = 0;
  virtual void launch(PrimitivePtr p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) = 0;
  virtual void run(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) = 0;
  virtual std::unique_ptr<PreparedKernel> prepare(Primitive& p, const std::vector<Tensor>& ins,
                                                  const std::vector<Tensor>& outs) = 0;
  // dst = src on one device: dst contiguous, same shape and dtype; src any view (run now).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // The whole plan as one kernel, or null: the executor runs it step by step. live_out[v]: value
  // v outlives the plan (its storage is handed out after the run).
  // SPMD (decision 0060): readies `parts` devices starting at `d` for storages split over them
  // (runtime/sharding.h) and programs over them; throws naming `where` and why when this
  // backend cannot (the default: it has no SPMD programs).
  virtual void prepare_sharding(const Device& d, int parts, const char* where);
  virtual std::unique_ptr<GraphKernel> prepare_graph(const std::vector<GraphStep>& /*steps*/,
                                                     const std::vector<char>& /*live_out*/) {
    return nullptr;
  }
};

// Called once per backend by register_builtin_backends(); the registry owns it.
void register_backend(std::unique_ptr<Backend> backend);
// Takes the backend of device type t out of the registry and hands it back (tests: a stand-in
// registered for one test). Free its storages first: a storage frees through backend_for.
std::unique_ptr<Backend> unregister_backend(DeviceType t);
// The backend of d's device type; throws "[device] cuda:0 is not available in this
// build/machine; available: cpu" when none is built (or it has no such device).
Backend& backend_for(const Device& d);
// Every registered backend, in registration order.
const std::vector<Backend*>& backends();
// Waits for the queued work of every device (no deferred materialisation; see synchronize()).
void wait_all_streams();
// Can fused kernels (runtime/fusion.h) run on d?
bool fusion_supported(const Device& d);
// Defined in src/backends/register_backends.cpp (one line per backend); the registry calls it at
// first use. A strong reference, so the static library keeps the backends' object files.
void register_builtin_backends();

}  // namespace tessera
