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

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Buffer;
struct PJRT_Event;
struct PJRT_LoadedExecutable;

namespace tessera::xla {

// One compiled program (the plugin's loaded executable); destroyed with the last reference.
class PjrtExecutable {
 public:
  PjrtExecutable(const PJRT_Api* api, PJRT_LoadedExecutable* exe) : api_(api), exe_(exe) {}
  ~PjrtExecutable();
  PjrtExecutable(const PjrtExecutable&) = delete;
  PjrtExecutable& operator=(const PjrtExecutable&) = delete;
  PJRT_LoadedExecutable* get() const { return exe_; }

 private:
  const PJRT_Api* api_;
  PJRT_LoadedExecutable* exe_;
};

class PjrtClient {
 public:
  // Loads `plugin_path` (dlopen, GetPjrtApi), initialises it and creates a client on
  // `platform` ("cpu", "cuda", "tpu"); throws "[xla] ..." with the plugin's message on failure.
  PjrtClient(const std::string& plugin_path, const std::string& platform);
  ~PjrtClient();
  PjrtClient(const PjrtClient&) = delete;
  PjrtClient& operator=(const PjrtClient&) = delete;

  const std::string& platform() const { return platform_; }
  const std::string& plugin_path() const { return plugin_path_; }
  std::string api_version() const;  // "0.81"
  size_t num_devices() const { return devices_.size(); }

  // StableHLO module text -> executable for one replica on device 0 (never empty options).
  std::shared_ptr<PjrtExecutable> compile(const std::string& mlir_text);
  // A u8[nbytes] buffer on device `device` holding a copy of `data` (copied before returning).
  PJRT_Buffer* upload_bytes(const void* data, size_t nbytes, int device);
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
  int64_t forget_buffer(PJRT_Buffer* buf);             // its bytes (0: unknown or donated)
  std::string plugin_path_, platform_;
  void* dl_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::unordered_map<PJRT_Buffer*, int64_t> buffer_size_;  // live buffers; donated ones: 0
};

// The default plugin for a platform: TESSERA_PJRT_PLUGIN (cpu), TESSERA_PJRT_CUDA_PLUGIN (cuda),
// TESSERA_LIBTPU_PATH (tpu), else the wheel that scripts/setup_xla.sh installs under
// ~/.cache/tessera/xla; "" when none is configured or the file is missing.
std::string default_plugin_path(const std::string& platform);

}  // namespace tessera::xla
