#include "backends/xla/pjrt_client.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>
#include <pjrt_c_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/env.h"
#include "runtime/error.h"

namespace tessera::xla {
namespace {

// executable_build_options { num_replicas: 1, num_partitions: 1 } as a serialized
// xla.CompileOptionsProto: empty options abort every plugin (Check failed: replica_count > 0).
constexpr char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01};

// Protobuf wire format, enough for the compile options: varints and length-delimited fields.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += char(v);
}
void put_int(std::string& out, int field, int64_t v) {
  put_varint(out, uint64_t(field) << 3);  // wire type 0
  put_varint(out, uint64_t(v));
}
void put_bytes(std::string& out, int field, const std::string& v) {
  put_varint(out, (uint64_t(field) << 3) | 2);
  put_varint(out, v.size());
  out += v;
}

template <typename Args>
Args make_args(size_t size) {
  Args a{};
  a.struct_size = size;
  return a;
}
#define PJRT_ARGS(T) make_args<T>(T##_STRUCT_SIZE)

std::string error_text(const PJRT_Api* api, PJRT_Error* err) {
  auto m = PJRT_ARGS(PJRT_Error_Message_Args);
  m.error = err;
  api->PJRT_Error_Message(&m);
  std::string s(m.message, m.message_size);
  auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
  d.error = err;
  api->PJRT_Error_Destroy(&d);
  return s;
}

// The buffer byte counters of every client (PjrtClient::buffer_bytes).
std::mutex g_bytes_mu;
PjrtClient::BufferBytes g_bytes;

// Whether the plugin's function table reaches `field` (older plugins have shorter tables).
#define PJRT_HAS(api, field) \
  ((api)->struct_size >= offsetof(PJRT_Api, field) + sizeof(void*) && (api)->field)

std::string named_values(const PJRT_NamedValue* v, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += std::string(v[i].name, v[i].name_size) + '=';
    switch (v[i].type) {
      case PJRT_NamedValue_kString:
        s += std::string(v[i].string_value, v[i].value_size);
        break;
      case PJRT_NamedValue_kInt64:
        s += std::to_string(v[i].int64_value);
        break;
      case PJRT_NamedValue_kInt64List:
        for (size_t k = 0; k < v[i].value_size; ++k)
          s += (k ? "." : "") + std::to_string(v[i].int64_array_value[k]);
        break;
      case PJRT_NamedValue_kFloat:
        s += std::to_string(v[i].float_value);
        break;
      case PJRT_NamedValue_kBool:
        s += v[i].bool_value ? "true" : "false";
        break;
    }
    s += ' ';
  }
  return s;
}

// libtpu logs several lines about missing cloud metadata (accelerator type, worker hostnames)
// while it loads and initialises off Google Cloud; its errors come back through PJRT_Error, so
// stderr is muted around those calls unless the user asked for all logs (TF_CPP_MIN_LOG_LEVEL=0).
class MutedStderr {
 public:
  explicit MutedStderr(bool on) {
    const char* level = std::getenv("TF_CPP_MIN_LOG_LEVEL");
    if (!on || (level && std::string(level) == "0")) return;
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ < 0 || null < 0 || ::dup2(null, 2) < 0) restore();
    if (null >= 0) ::close(null);
  }
  ~MutedStderr() { restore(); }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
};

}  // namespace

PjrtExecutable::~PjrtExecutable() {
  if (unloaded_) {
    auto a = PJRT_ARGS(PJRT_Executable_Destroy_Args);
    a.executable = unloaded_;
    if (PJRT_Error* e = api_->PJRT_Executable_Destroy(&a)) error_text(api_, e);
  }
  if (exe_) {
    auto a = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
    a.executable = exe_;
    if (PJRT_Error* e = api_->PJRT_LoadedExecutable_Destroy(&a)) error_text(api_, e);
  }
}

PJRT_Executable* PjrtExecutable::executable() const {
  if (!unloaded_ && exe_) {
    auto a = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
    a.loaded_executable = exe_;
    if (PJRT_Error* e = api_->PJRT_LoadedExecutable_GetExecutable(&a))
      TESSERA_FAIL("[xla] PJRT_LoadedExecutable_GetExecutable failed: ", error_text(api_, e));
    unloaded_ = a.executable;
  }
  return unloaded_;
}

void PjrtClient::check(void* err, const char* call) {
  if (!err) return;
  TESSERA_FAIL("[xla] ", call, " failed on ", platform_, " (", plugin_path_,
               "): ", error_text(api_, static_cast<PJRT_Error*>(err)));
}

void PjrtClient::load_plugin() {
  if (platform_ == "tpu") setenv("TPU_SKIP_MDS_QUERY", "1", 0);  // off Google Cloud: no retries
  // Plugins log INFO lines to stderr (device counts, absl's start-up note): warnings and up only,
  // unless the user set the level.
  setenv("TF_CPP_MIN_LOG_LEVEL", "1", 0);
  MutedStderr mute(platform_ == "tpu");
  dl_ = dlopen(plugin_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl_) {
    const char* why = dlerror();
    TESSERA_FAIL("[xla] cannot load the PJRT plugin ", plugin_path_, ": ", why ? why : "?");
  }
  using GetApi = const PJRT_Api* (*)();
  auto get = reinterpret_cast<GetApi>(dlsym(dl_, "GetPjrtApi"));
  TESSERA_CHECK(get, "[xla] ", plugin_path_, " is not a PJRT plugin (no GetPjrtApi)");
  api_ = get();
  TESSERA_CHECK(api_, "[xla] ", plugin_path_, ": GetPjrtApi returned null");
  // Minor versions only add fields (struct_size tells them apart); a major version changes them.
  TESSERA_CHECK(api_->pjrt_api_version.major_version == PJRT_API_MAJOR, "[xla] ", plugin_path_,
                " has PJRT C API ", api_version(), "; tessera was built for major version ",
                PJRT_API_MAJOR);
  auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  if (PJRT_Error* e = api_->PJRT_Plugin_Initialize(&init)) {
    const std::string msg = error_text(api_, e);
    // libtpu lets one process at a time hold the machine's TPUs (a lock file in /tmp).
    TESSERA_CHECK(msg.find("lockfile") == std::string::npos, "[xla] libtpu is in use by another "
                  "process on this machine (it holds /tmp/libtpu_lockfile)");
    TESSERA_FAIL("[xla] PJRT_Plugin_Initialize failed on ", platform_, " (", plugin_path_, "): ",
                 msg);
  }
}

PjrtClient::PjrtClient(const std::string& plugin_path, const std::string& platform,
                       const std::string& topology)
    : plugin_path_(plugin_path), platform_(platform), topology_name_(topology) {
  // Compiling uses no TPU: libtpu's one-process-per-machine lock does not apply.
  if (platform == "tpu") setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
  load_plugin();
  TESSERA_CHECK(PJRT_HAS(api_, PJRT_TopologyDescription_Create) && PJRT_HAS(api_, PJRT_Compile),
                "[xla] ", plugin_path, " cannot compile without devices (no PJRT_Compile)");
  auto t = PJRT_ARGS(PJRT_TopologyDescription_Create_Args);
  t.topology_name = topology.data();
  t.topology_name_size = topology.size();
  if (PJRT_Error* e = api_->PJRT_TopologyDescription_Create(&t))
    TESSERA_FAIL("[xla] the ", platform, " plugin does not know the topology '", topology,
                 "' (", error_text(api_, e), "); names look like v6e:1x1, v6e:2x2, v5e:2x2, v4:2x2x1");
  topology_ = t.topology;
  auto d = PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  d.topology = topology_;
  check(api_->PJRT_TopologyDescription_GetDeviceDescriptions(&d),
        "PJRT_TopologyDescription_GetDeviceDescriptions");
  target_devices_ = d.num_descriptions;
  for (size_t i = 0; i < d.num_descriptions; ++i) {
    auto id = PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
    id.device_description = d.descriptions[i];
    check(api_->PJRT_DeviceDescription_Id(&id), "PJRT_DeviceDescription_Id");
    device_ids_.push_back(id.id);
  }
  if (d.num_descriptions > 0) {
    auto k = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
    k.device_description = d.descriptions[0];
    check(api_->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
    device_kind_.assign(k.device_kind, k.device_kind_size);
  }
  make_identity();
}

PjrtClient::PjrtClient(const std::string& plugin_path, const std::string& platform,
                       int cpu_devices)
    : plugin_path_(plugin_path), platform_(platform) {
  load_plugin();

  std::vector<PJRT_NamedValue> opts;
  auto named_int = [&](const char* name, int64_t v) {
    PJRT_NamedValue nv{};
    nv.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    nv.name = name;
    nv.name_size = std::char_traits<char>::length(name);
    nv.type = PJRT_NamedValue_kInt64;
    nv.int64_value = v;
    nv.value_size = 1;
    opts.push_back(nv);
  };
  auto named_bool = [&](const char* name, bool v) {
    PJRT_NamedValue nv{};
    nv.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    nv.name = name;
    nv.name_size = std::char_traits<char>::length(name);
    nv.type = PJRT_NamedValue_kBool;
    nv.bool_value = v;
    nv.value_size = 1;
    opts.push_back(nv);
  };
  // 4 devices by default on a 2-core machine: one unless asked (SPMD programs need more).
  if (platform == "cpu") named_int("cpu_device_count", cpu_devices);
  if (platform == "cuda") named_bool("preallocate", false);  // else ~75% of GPU memory is taken
  auto c = PJRT_ARGS(PJRT_Client_Create_Args);
  c.create_options = opts.data();
  c.num_options = opts.size();
  PJRT_Error* create_error;
  {
    MutedStderr mute(platform == "tpu");
    create_error = api_->PJRT_Client_Create(&c);
  }
  if (PJRT_Error* e = create_error) {
    std::string msg = error_text(api_, e);
    if (msg.find("No jellyfish device") != std::string::npos ||
        msg.find("No visible GPU") != std::string::npos)
      TESSERA_FAIL("[xla] no ", platform == "tpu" ? "TPU" : "GPU", " found on this machine (",
                   plugin_path, ": ", msg, ")");
    TESSERA_FAIL("[xla] PJRT_Client_Create failed on ", platform, " (", plugin_path, "): ", msg);
  }
  client_ = c.client;
  auto d = PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  d.client = client_;
  check(api_->PJRT_Client_AddressableDevices(&d), "PJRT_Client_AddressableDevices");
  devices_.assign(d.addressable_devices, d.addressable_devices + d.num_addressable_devices);
  target_devices_ = devices_.size();
  for (PJRT_Device* dev : devices_) {
    auto g = PJRT_ARGS(PJRT_Device_GetDescription_Args);
    g.device = dev;
    check(api_->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription");
    auto id = PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
    id.device_description = g.device_description;
    check(api_->PJRT_DeviceDescription_Id(&id), "PJRT_DeviceDescription_Id");
    device_ids_.push_back(id.id);
  }
  if (!devices_.empty()) {
    auto g = PJRT_ARGS(PJRT_Device_GetDescription_Args);
    g.device = devices_[0];
    check(api_->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription");
    auto k = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
    k.device_description = g.device_description;
    check(api_->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
    device_kind_.assign(k.device_kind, k.device_kind_size);
  }
  make_identity();
}

void PjrtClient::make_identity() {
  std::error_code ec;
  const auto size = std::filesystem::file_size(plugin_path_, ec);
  std::string attrs, version;
  if (PJRT_HAS(api_, PJRT_Plugin_Attributes)) {
    auto a = PJRT_ARGS(PJRT_Plugin_Attributes_Args);
    if (PJRT_Error* e = api_->PJRT_Plugin_Attributes(&a))
      error_text(api_, e);
    else
      attrs = named_values(a.attributes, a.num_attributes);
  }
  if (topology_) {
    auto v = PJRT_ARGS(PJRT_TopologyDescription_PlatformVersion_Args);
    v.topology = topology_;
    if (PJRT_Error* e = api_->PJRT_TopologyDescription_PlatformVersion(&v))
      error_text(api_, e);
    else
      version.assign(v.platform_version, v.platform_version_size);
  } else {
    auto v = PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
    v.client = client_;
    check(api_->PJRT_Client_PlatformVersion(&v), "PJRT_Client_PlatformVersion");
    version.assign(v.platform_version, v.platform_version_size);
  }
  identity_ = "platform=" + platform_ + " plugin=" + plugin_path_ + " plugin_bytes=" +
              std::to_string(ec ? 0 : size) + " api=" + api_version() + " " + attrs +
              "platform_version=" + version + " device=" + device_kind_ + " x" +
              std::to_string(target_devices_);
  for (char& c : identity_)
    if (c == '\n' || c == '\r') c = ' ';
}

PjrtClient::~PjrtClient() {
  if (client_) {
    auto a = PJRT_ARGS(PJRT_Client_Destroy_Args);
    a.client = client_;
    if (PJRT_Error* e = api_->PJRT_Client_Destroy(&a)) error_text(api_, e);
  }
  if (topology_) {
    auto a = PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args);
    a.topology = topology_;
    if (PJRT_Error* e = api_->PJRT_TopologyDescription_Destroy(&a)) error_text(api_, e);
  }
  // The plugin stays loaded: its threads may outlive the client.
}

std::string PjrtClient::api_version() const {
  return std::to_string(api_->pjrt_api_version.major_version) + "." +
         std::to_string(api_->pjrt_api_version.minor_version);
}

std::string PjrtClient::compile_options() {
  return std::string(kCompileOptions, sizeof kCompileOptions);
}

// xla.CompileOptionsProto { executable_build_options (3) { num_replicas (4): 1,
// num_partitions (5): N, use_spmd_partitioning (6): true, device_assignment (9):
// DeviceAssignmentProto { replica_count (1): 1, computation_count (2): N,
// computation_devices (3): one per partition { replica_device_ids (1): [id] } } } }.
std::string PjrtClient::compile_options(int partitions, const std::vector<int64_t>& device_ids) {
  if (partitions <= 1) return compile_options();
  std::string assignment;
  put_int(assignment, 1, 1);
  put_int(assignment, 2, partitions);
  for (int p = 0; p < partitions; ++p) {
    std::string computation;
    put_int(computation, 1, device_ids.at(size_t(p)));
    put_bytes(assignment, 3, computation);
  }
  std::string build;
  put_int(build, 4, 1);
  put_int(build, 5, partitions);
  put_int(build, 6, 1);
  put_bytes(build, 9, assignment);
  std::string options;
  put_bytes(options, 3, build);
  return options;
}

std::vector<int64_t> PjrtClient::mesh_device_ids(int partitions) const {
  TESSERA_CHECK(partitions >= 1 && size_t(partitions) <= device_ids_.size(), "[xla] a program over ",
                partitions, " devices, but the ", platform_,
                compile_only() ? " target " + topology_name_ : std::string(" plugin"), " has ",
                device_ids_.size(), " device(s)",
                platform_ == "cpu" ? " (TESSERA_XLA_CPU_DEVICES sets how many xla:cpu has)" : "");
  return std::vector<int64_t>(device_ids_.begin(), device_ids_.begin() + partitions);
}

std::shared_ptr<PjrtExecutable> PjrtClient::compile(const std::string& mlir_text, int partitions) {
  const std::string options =
      partitions > 1 ? compile_options(partitions, mesh_device_ids(partitions)) : compile_options();
  PJRT_Program prog{};
  prog.struct_size = PJRT_Program_STRUCT_SIZE;
  prog.code = const_cast<char*>(mlir_text.data());
  prog.code_size = mlir_text.size();
  prog.format = "mlir";
  prog.format_size = 4;
  if (topology_) {  // ahead of time, for a topology without its devices
    auto a = PJRT_ARGS(PJRT_Compile_Args);
    a.topology = topology_;
    a.program = &prog;
    a.compile_options = options.data();
    a.compile_options_size = options.size();
    check(api_->PJRT_Compile(&a), "compiling a StableHLO module");
    return std::make_shared<PjrtExecutable>(api_, a.executable);
  }
  auto a = PJRT_ARGS(PJRT_Client_Compile_Args);
  a.client = client_;
  a.program = &prog;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  check(api_->PJRT_Client_Compile(&a), "compiling a StableHLO module");
  return std::make_shared<PjrtExecutable>(api_, a.executable);
}

std::string PjrtClient::serialize(const PjrtExecutable& exe) {
  auto a = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  a.executable = exe.executable();
  check(api_->PJRT_Executable_Serialize(&a), "PJRT_Executable_Serialize");
  std::string bytes(a.serialized_bytes, a.serialized_bytes_size);
  if (a.serialized_executable_deleter) a.serialized_executable_deleter(a.serialized_executable);
  return bytes;
}

std::shared_ptr<PjrtExecutable> PjrtClient::deserialize(const std::string& bytes) {
  TESSERA_CHECK(client_, "[xla] the ", platform_, " target ", topology_name_,
                " is compile-only: executables cannot be loaded");
  auto a = PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  check(api_->PJRT_Executable_DeserializeAndLoad(&a), "PJRT_Executable_DeserializeAndLoad");
  return std::make_shared<PjrtExecutable>(api_, a.loaded_executable);
}

bool PjrtClient::memory(const PjrtExecutable& exe, CompiledMemory* out) {
  if (!PJRT_HAS(api_, PJRT_Executable_GetCompiledMemoryStats)) return false;
  auto a = PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  a.executable = exe.executable();
  if (PJRT_Error* e = api_->PJRT_Executable_GetCompiledMemoryStats(&a)) {
    error_text(api_, e);  // UNIMPLEMENTED on some plugins
    return false;
  }
  out->arguments = a.argument_size_in_bytes;
  out->outputs = a.output_size_in_bytes;
  out->aliased = a.alias_size_in_bytes;
  out->temporaries = a.temp_size_in_bytes;
  out->code = a.generated_code_size_in_bytes;
  out->peak = a.peak_memory_in_bytes;
  return true;
}

PJRT_Buffer* PjrtClient::upload_bytes(const void* data, size_t nbytes, int device) {
  return upload(data, nbytes, PJRT_Buffer_Type_U8, {int64_t(nbytes)}, device);
}

PJRT_Buffer* PjrtClient::upload_typed(const void* data, size_t nbytes, DType dtype,
                                      const std::vector<int64_t>& dims, int device) {
  PJRT_Buffer_Type type = PJRT_Buffer_Type_U8;
  switch (dtype) {
    case DType::f32: type = PJRT_Buffer_Type_F32; break;
    case DType::bf16: type = PJRT_Buffer_Type_BF16; break;
    case DType::f16: type = PJRT_Buffer_Type_F16; break;
    default:
      TESSERA_FAIL("[xla] a typed buffer of ", dtype_name(dtype),
                   ": only f32, bf16 and f16 pieces are uploaded typed");
  }
  return upload(data, nbytes, type, dims, device);
}

PJRT_Buffer* PjrtClient::upload(const void* data, size_t nbytes, int type,
                                const std::vector<int64_t>& dims, int device) {
  TESSERA_CHECK(client_, "[xla] the ", platform_, " target ", topology_name_,
                " is compile-only: it holds no data");
  TESSERA_CHECK(device >= 0 && size_t(device) < devices_.size(), "[xla] device index ", device,
                " out of range: the ", platform_, " plugin has ", devices_.size(), " device(s)");
  auto a = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client_;
  a.data = data;
  a.type = PJRT_Buffer_Type(type);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  a.device = devices_[size_t(device)];
  check(api_->PJRT_Client_BufferFromHostBuffer(&a), "PJRT_Client_BufferFromHostBuffer");
  if (a.done_with_host_buffer) await(a.done_with_host_buffer, "an upload");
  note_buffer(a.buffer, int64_t(nbytes));
  return a.buffer;
}

void PjrtClient::note_buffer(PJRT_Buffer* buf, int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_bytes_mu);
  buffer_size_[buf] = bytes;
  g_bytes.live += bytes;
  g_bytes.buffers++;
  g_bytes.peak = std::max(g_bytes.peak, g_bytes.live);
}

int64_t PjrtClient::forget_buffer(PJRT_Buffer* buf) {
  std::lock_guard<std::mutex> lock(g_bytes_mu);
  auto it = buffer_size_.find(buf);
  if (it == buffer_size_.end()) return 0;
  const int64_t n = it->second;
  buffer_size_.erase(it);
  g_bytes.live -= n;
  g_bytes.buffers--;
  return n;
}

PjrtClient::BufferBytes PjrtClient::buffer_bytes() {
  std::lock_guard<std::mutex> lock(g_bytes_mu);
  return g_bytes;
}

void PjrtClient::reset_buffer_stats() {
  std::lock_guard<std::mutex> lock(g_bytes_mu);
  g_bytes.peak = g_bytes.live;
  g_bytes.donated = 0;
}

bool PjrtClient::is_deleted(PJRT_Buffer* buf) {
  auto a = PJRT_ARGS(PJRT_Buffer_IsDeleted_Args);
  a.buffer = buf;
  check(api_->PJRT_Buffer_IsDeleted(&a), "PJRT_Buffer_IsDeleted");
  return a.is_deleted;
}

int64_t PjrtClient::plugin_bytes_in_use(int device) {
  if (device < 0 || size_t(device) >= devices_.size()) return -1;
  auto a = PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  a.device = devices_[size_t(device)];
  if (PJRT_Error* e = api_->PJRT_Device_MemoryStats(&a)) {  // the CPU plugin: UNIMPLEMENTED
    error_text(api_, e);
    return -1;
  }
  return a.bytes_in_use;
}

void PjrtClient::download(PJRT_Buffer* buf, void* dst, size_t nbytes) {
  auto a = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  a.src = buf;
  a.dst = dst;
  a.dst_size = nbytes;
  check(api_->PJRT_Buffer_ToHostBuffer(&a), "PJRT_Buffer_ToHostBuffer");
  if (a.event) await(a.event, "a download");
}

void PjrtClient::destroy(PJRT_Buffer* buf) {
  if (!buf) return;
  forget_buffer(buf);
  auto a = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  a.buffer = buf;
  if (PJRT_Error* e = api_->PJRT_Buffer_Destroy(&a)) error_text(api_, e);
}

std::vector<PJRT_Buffer*> PjrtClient::execute(const PjrtExecutable& exe,
                                              const std::vector<PJRT_Buffer*>& args,
                                              const std::vector<size_t>& out_bytes,
                                              const std::vector<int>& donated, PJRT_Event** done) {
  std::vector<PJRT_Event*> events;
  auto outs = execute_spmd(exe, {args}, out_bytes, donated, &events);
  *done = events[0];
  return outs[0];
}

std::vector<std::vector<PJRT_Buffer*>> PjrtClient::execute_spmd(
    const PjrtExecutable& exe, const std::vector<std::vector<PJRT_Buffer*>>& args,
    const std::vector<size_t>& out_bytes, const std::vector<int>& donated,
    std::vector<PJRT_Event*>* done) {
  TESSERA_CHECK(exe.get(), "[xla] the ", platform_, " target ", topology_name_,
                " is compile-only: no device runs its executables");
  const size_t n = args.size(), nargs = args.empty() ? 0 : args[0].size();
  PJRT_ExecuteOptions opts{};
  opts.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  // Only the args we donate may be reused: a buffer still referenced is never given away.
  std::vector<int64_t> keep;
  for (size_t i = 0; i < nargs; ++i)
    if (std::find(donated.begin(), donated.end(), int(i)) == donated.end())
      keep.push_back(int64_t(i));
  opts.non_donatable_input_indices = keep.data();
  opts.num_non_donatable_input_indices = keep.size();
  std::vector<std::vector<PJRT_Buffer*>> outs(n, std::vector<PJRT_Buffer*>(out_bytes.size()));
  std::vector<PJRT_Buffer* const*> arg_lists;
  std::vector<PJRT_Buffer**> out_lists;
  for (size_t d = 0; d < n; ++d) {
    arg_lists.push_back(args[d].data());
    out_lists.push_back(outs[d].data());
  }
  done->assign(n, nullptr);
  auto a = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe.get();
  a.options = &opts;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = nargs;
  a.output_lists = out_lists.data();
  a.device_complete_events = done->data();
  check(api_->PJRT_LoadedExecutable_Execute(&a), "PJRT_LoadedExecutable_Execute");
  // A donated input the plugin took is deleted now: its bytes became a result's.
  for (size_t d = 0; d < n; ++d)
    for (int i : donated) {
      PJRT_Buffer* b = args[d][size_t(i)];
      if (!is_deleted(b)) continue;
      std::lock_guard<std::mutex> lock(g_bytes_mu);
      auto it = buffer_size_.find(b);
      if (it == buffer_size_.end()) continue;
      g_bytes.live -= it->second;
      g_bytes.donated += it->second;
      it->second = 0;
    }
  for (auto& o : outs)
    for (size_t q = 0; q < o.size(); ++q) note_buffer(o[q], int64_t(out_bytes[q]));
  return outs;
}

PJRT_Buffer* PjrtClient::copy_to_device(PJRT_Buffer* buf, int device) {
  TESSERA_CHECK(device >= 0 && size_t(device) < devices_.size(), "[xla] device index ", device,
                " out of range: the ", platform_, " plugin has ", devices_.size(), " device(s)");
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_bytes_mu);
    auto it = buffer_size_.find(buf);
    if (it != buffer_size_.end()) bytes = it->second;
  }
  auto a = PJRT_ARGS(PJRT_Buffer_CopyToDevice_Args);
  a.buffer = buf;
  a.dst_device = devices_[size_t(device)];
  check(api_->PJRT_Buffer_CopyToDevice(&a), "PJRT_Buffer_CopyToDevice");
  note_buffer(a.dst_buffer, bytes);
  return a.dst_buffer;
}

void PjrtClient::await(PJRT_Event* e, const char* what) {
  auto a = PJRT_ARGS(PJRT_Event_Await_Args);
  a.event = e;
  PJRT_Error* err = api_->PJRT_Event_Await(&a);
  auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
  d.event = e;
  api_->PJRT_Event_Destroy(&d);
  if (err) TESSERA_FAIL("[xla] ", what, " failed on ", platform_, ": ", error_text(api_, err));
}

std::string default_plugin_path(const std::string& platform) {
  EnvVar var = platform == "cpu"    ? EnvVar::pjrt_plugin
               : platform == "cuda" ? EnvVar::pjrt_cuda_plugin
                                    : EnvVar::libtpu_path;
  std::string p = env::string(var);
  if (p == "none") return "";
  if (!p.empty()) return p;  // named explicitly: a missing file is an error at load
  const char* home = std::getenv("HOME");
  if (!home) return "";
  const std::string root = std::string(home) + "/.cache/tessera/xla/";
  if (platform == "cpu")
    p = root + "xla-cpu-pjrt-0.0.1/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
  else if (platform == "tpu")
    p = root + "libtpu/libtpu/libtpu.so";
  else
    return "";
  std::error_code ec;
  return std::filesystem::exists(p, ec) ? p : "";
}

}  // namespace tessera::xla
