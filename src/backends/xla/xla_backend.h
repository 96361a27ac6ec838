// The XLA backend (decision 0031): tensors live in PJRT buffers, each op runs as a StableHLO
// executable compiled once per (primitive, attributes, views, dtypes) and cached; PJRT runs
// them asynchronously and host reads wait. Devices xla:cpu[:i], xla:cuda[:i] and tpu[:i].
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace tessera {

// The backend of DeviceType::xla (xla:cpu, xla:cuda) or DeviceType::tpu (libtpu).
std::unique_ptr<Backend> make_xla_backend(DeviceType type);

// Counters of the XLA backends (tests and benchmarks).
struct XlaStats {
  int64_t compiles = 0;        // executables compiled
  int64_t cache_hits = 0;      // ops that reused one
  int64_t executions = 0;      // executables run
  double compile_seconds = 0;  // time in PJRT_Client_Compile
  int64_t graph_compiles = 0;  // whole segments / programs compiled as one executable
  int64_t graph_hits = 0;      // runs that found theirs
  int64_t graph_runs = 0;
  int64_t module_hits = 0;  // modules found compiled already (same text)
  int64_t spmd_runs = 0;    // programs run split over several devices (decision 0060)
  // The executable cache on disk (TESSERA_CACHE_DIR, decision 0045): of the executables the
  // counters above needed, plugin_compiles were compiled by the plugin and disk_hits loaded.
  int64_t plugin_compiles = 0;
  int64_t disk_hits = 0;
  int64_t disk_writes = 0;
  int64_t disk_rejected = 0;  // entries found unusable (corrupt, truncated, refused): recompiled
  int64_t aot_skipped_ops = 0;  // compile-only: eager ops not run (they have no data to run on)
  // Ops run on the CPU through host copies (no lowering), by primitive name (decision 0032).
  std::map<std::string, int64_t> fallbacks;
  // Device buffers held (every XLA client): bytes now, their high-water mark since the last
  // reset, bytes of inputs donated to a result since then (decision 0050), buffers now.
  int64_t live_bytes = 0, peak_bytes = 0, donated_bytes = 0, live_buffers = 0;
};
XlaStats xla_stats();
void reset_xla_stats();  // counters to 0, peak_bytes to live_bytes
// Buffer donation on or off (default: TESSERA_XLA_DONATE); executables compiled either way stay.
void set_xla_donation(bool on);
// The plugin's own bytes-in-use for device `d` (PJRT_Device_MemoryStats), -1 when it has none.
int64_t xla_plugin_bytes_in_use(const Device& d);
// The StableHLO text of the last module compiled (for error reports and tests).
std::string xla_last_module();

// Ahead-of-time compilation (tessera compile, decision 0046). While on, XLA devices compile the
// programs of deferred segments and compiled functions (and write them to the cache folder)
// but run nothing: buffers hold no data, eager ops are skipped, reading a tensor is an error.
// A non-empty `tpu_topology` ("v6e:2x2") makes the tpu device compile for that topology
// through libtpu without a TPU; set it before the tpu device is first used.
void set_xla_compile_only(bool on, const std::string& tpu_topology = "");
bool xla_compile_only();

// One program compiled while compile-only was on.
struct XlaAotProgram {
  std::string platform, target;  // "tpu", "v6e:2x2 (4 x TPU v6 lite)"
  int partitions = 1;            // SPMD: devices the program is split over (memory is per device)
  int64_t ops = 0;               // primitives lowered into it
  double compile_seconds = 0;
  bool has_memory = false;  // the plugin reported the executable's memory statistics
  int64_t argument_bytes = 0, output_bytes = 0, alias_bytes = 0, temp_bytes = 0, code_bytes = 0;
  int64_t peak_bytes = 0;        // the plugin's peak estimate (0: none)
  std::string cache_file;        // where the serialized executable went ("": no cache folder)
  int64_t serialized_bytes = 0;
};
std::vector<XlaAotProgram> xla_aot_programs();

}  // namespace tessera
