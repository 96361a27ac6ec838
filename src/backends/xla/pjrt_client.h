// A thin C++ face on a PJRT plugin (the C API in pjrt_c_api.h): load the plugin, check its API
// version, create a client, compile StableHLO text, move buffers, execute, await events. Every
// PJRT error becomes a tessera::Error naming the call; nothing here aborts (decision 0030).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/dtype.h"

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Buffer;
struct PJRT_Event;
struct PJRT_Executable;
struct PJRT_LoadedExecutable;
struct PJRT_TopologyDescription;

namespace tessera::xla {

// One compiled program, destroyed with the last reference: a loaded executable (runs on the
// client's devices) or, compiled for a topology without devices, an unloaded one (serializable).
class PjrtExecutable {
 public:
  PjrtExecutable(const PJRT_Api* api, PJRT_LoadedExecutable* exe) : api_(api), exe_(exe) {}
  PjrtExecutable(const PJRT_Api* api, PJRT_Executable* unloaded)
      : api_(api), exe_(nullptr), unloaded_(unloaded) {}
  ~PjrtExecutable();
  PjrtExecutable(const PjrtExecutable&) = delete;
  PjrtExecutable& operator=(const PjrtExecutable&) = delete;
  PJRT_LoadedExecutable* get() const { return exe_; }  // null when compiled without devices
  // The executable behind it (serialize, memory statistics); owned here.
  PJRT_Executable* executable() const;

 private:
  const PJRT_Api* api_;
  PJRT_LoadedExecutable* exe_;
  mutable PJRT_Executable* unloaded_ = nullptr;
};

// What a compiled executable needs in the device's memory (PJRT_Executable_GetCompiledMemoryStats,
// mirroring xla::CompiledMemoryStats), in bytes.
struct CompiledMemory {
  int64_t arguments = 0, outputs = 0, aliased = 0, temporaries = 0, code = 0;
  int64_t peak = 0;  // the plugin's own peak estimate (0: not given)
};

class PjrtClient {
 public:
  // Loads `plugin_path` (dlopen, GetPjrtApi), initialises it and creates a client on
  // `platform` ("cpu", "cuda", "tpu"); throws "[xla] ..." with the plugin's message on failure.
  // `cpu_devices`: how many devices the CPU plugin exposes (its create option
  // cpu_device_count); SPMD programs run over several.
  PjrtClient(const std::string& plugin_path, const std::string& platform, int cpu_devices = 1);
  // Compile-only: no client and no device, executables compiled for the named topology of the
  // plugin's platform (libtpu: "v6e:2x2"); running one is an error. Throws "[xla] ..." naming the
  // topology when the plugin refuses it.
  PjrtClient(const std::string& plugin_path, const std::string& platform,
             const std::string& topology);
  ~PjrtClient();
  PjrtClient(const PjrtClient&) = delete;
  PjrtClient& operator=(const PjrtClient&) = delete;

  const std::string& platform() const { return platform_; }
  const std::string& plugin_path() const { return plugin_path_; }
  std::string api_version() const;  // "0.81"
  size_t num_devices() const { return compile_only() ? 1 : devices_.size(); }
  bool compile_only() const { return topology_ != nullptr; }
  const std::string& topology_name() const { return topology_name_; }
  // Devices of the compile target: the client's, or the topology's (a 2x2 topology has 4).
  size_t target_devices() const { return target_devices_; }
  const std::string& device_kind() const { return device_kind_; }  // "TPU v6 lite", "cpu"
  // Everything an executable depends on besides its module and options, on one line: platform,
  // plugin file (path, size), API version, the plugin's version attributes, the platform
  // version, the target's device kind and count. Keys the executable cache on disk.
  const std::string& identity() const { return identity_; }
  // The serialized xla.CompileOptionsProto every compile sends (never empty: decision 0030).
  static std::string compile_options();
  // The same for one SPMD program over `partitions` devices (one replica, SPMD partitioning
  // on, partition i on device_ids[i]); one partition gives compile_options().
  static std::string compile_options(int partitions, const std::vector<int64_t>& device_ids);
  // The ids of the first `partitions` devices of the target (the client's or the topology's);
  // throws "[xla] ..." when it has fewer.
  std::vector<int64_t> mesh_device_ids(int partitions) const;

  // StableHLO module text -> executable for one replica on device 0 (never empty options), or
  // with `partitions` > 1 one SPMD program over devices 0..partitions-1 (the module carries
  // mhlo.sharding annotations; XLA's partitioner inserts the collectives).
  std::shared_ptr<PjrtExecutable> compile(const std::string& mlir_text, int partitions = 1);
  // The plugin's serialization of `exe` (PJRT_Executable_Serialize).
  std::string serialize(const PjrtExecutable& exe);
  // An executable from serialize()'s bytes (PJRT_Executable_DeserializeAndLoad); throws
  // "[xla] ..." when the plugin rejects them. Not on a compile-only client.
  std::shared_ptr<PjrtExecutable> deserialize(const std::string& bytes);
  // The executable's memory needs; false when the plugin does not report them.
  bool memory(const PjrtExecutable& exe, CompiledMemory* out);
  // A u8[nbytes] buffer on device `device` holding a copy of `data` (copied before returning).
  PJRT_Buffer* upload_bytes(const void* data, size_t nbytes, int device);
  // A buffer of `dtype` (f32, bf16, f16) and shape `dims` on `device`: an SPMD piece, typed so
  // XLA's partitioner sees the weight's elements (decision 0060).
  PJRT_Buffer* upload_typed(const void* data, size_t nbytes, DType dtype,
                            const std::vector<int64_t>& dims, int device);
  // The whole buffer into `dst` (waits for the buffer's producer).
  void download(PJRT_Buffer* buf, void* dst, size_t nbytes);
  void destroy(PJRT_Buffer* buf);
  // Runs `exe` on `args`; returns one new buffer per entry of `out_bytes` (its size) and the
  // completion event. `donated`: indices of args whose buffer the executable may reuse for an
  // output (aliased in its module); every other arg is passed as non-donatable. A donated
  // buffer is dead afterwards (only destroy() may follow).
  std::vector<PJRT_Buffer*> execute(const PjrtExecutable& exe,
                                    const std::vector<PJRT_Buffer*>& args,
                                    const std::vector<size_t>& out_bytes,
                                    const std::vector<int>& donated, PJRT_Event** done);
  // An SPMD executable over args.size() devices: args[d] are device d's buffers (its shard of
  // a sharded parameter, its copy of a replicated one); returns each device's results and one
  // completion event per device.
  std::vector<std::vector<PJRT_Buffer*>> execute_spmd(
      const PjrtExecutable& exe, const std::vector<std::vector<PJRT_Buffer*>>& args,
      const std::vector<size_t>& out_bytes, const std::vector<int>& donated,
      std::vector<PJRT_Event*>* done);
  // A copy of `buf` on device `device` of this client.
  PJRT_Buffer* copy_to_device(PJRT_Buffer* buf, int device);
  // Waits for `e`, destroys it and throws the error it carries, if any.
  void await(PJRT_Event* e, const char* what);
  bool is_deleted(PJRT_Buffer* buf);

  // Bytes of the live buffers of every client (uploads and results, less destroyed and donated
  // ones): the device memory tessera holds, whether or not the plugin reports memory stats.
  struct BufferBytes {
    int64_t live = 0, peak = 0;
    int64_t donated = 0;  // bytes of inputs the plugin reused for a result (confirmed)
    int64_t buffers = 0;  // live buffers
  };
  static BufferBytes buffer_bytes();
  static void reset_buffer_stats();  // peak = live, donated = 0
  // The plugin's own device memory counter (PJRT_Device_MemoryStats), or -1 when it has none.
  int64_t plugin_bytes_in_use(int device);

 private:
  void check(void* err, const char* call);
  void note_buffer(PJRT_Buffer* buf, int64_t bytes);  // a new buffer of this client
  PJRT_Buffer* upload(const void* data, size_t nbytes, int type,  // a PJRT_Buffer_Type
                      const std::vector<int64_t>& dims, int device);
  int64_t forget_buffer(PJRT_Buffer* buf);             // its bytes (0: unknown or donated)
  void load_plugin();
  void make_identity();
  std::string plugin_path_, platform_, topology_name_, device_kind_, identity_;
  void* dl_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  PJRT_TopologyDescription* topology_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::vector<int64_t> device_ids_;  // the target's device ids (client devices or topology's)
  std::unordered_map<PJRT_Buffer*, int64_t> buffer_size_;  // live buffers; donated ones: 0
  size_t target_devices_ = 0;
};

// The default plugin for a platform: TESSERA_PJRT_PLUGIN (cpu), TESSERA_PJRT_CUDA_PLUGIN (cuda),
// TESSERA_LIBTPU_PATH (tpu), else the wheel that scripts/setup_xla.sh installs under
// ~/.cache/tessera/xla; "" when none is configured or the file is missing.
std::string default_plugin_path(const std::string& platform);

}  // namespace tessera::xla
