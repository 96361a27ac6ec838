// The one place tessera reads its environment (issue 18). Every TESSERA_* switch is in the table
// (env.cpp) with its kind, default, meaning and the decision that documents it; the typed
// accessors reject a malformed value ("[env] TESSERA_NUM_THREADS=abc: expected a positive
// integer") instead of ignoring it. They read the environment on every call: each caller keeps
// its own timing (a static read once, or a read per use), so tests may setenv before first use.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tessera {

enum class EnvVar {
  // Read by the library.
  num_threads,
  min_parallel_work,
  cpu_isa,
  defer_and_fuse,
  defer_max_nodes,
  defer_repeat_cut,
  defer_no_fuse,
  defer_no_replay,
  async_dispatch,
  launch_blocking,
  compile,
  cache_dir,
  packed_weight_cache_mb,
  sdpa_qblock,
  sdpa_f32_products,
  // Read by scripts and tests only (listed so that every TESSERA_* name has one description).
  skip_sanitize,
  fuzz_seconds,
  fuzz_cxx,
  conformance_seed,
  conformance_all,
  conformance_verbose,
  conformance_known_bugs,
  pipeline_device,
  // The XLA backend (src/backends/xla) and its setup script.
  pjrt_plugin,
  pjrt_cuda_plugin,
  libtpu_path,
  xla_fallback,
  xla_graphs,
  xla_donate,
  xla_cpu_devices,
  xla_setup,
  libtpu_setup,
  xla_dir,
  // Tensor parallelism over MPI (src/distributed).
  tp_timeout,
  launch_dir,
};

enum class EnvKind { flag, integer, string, choice };

struct EnvSpec {
  EnvVar var;
  const char* name;
  EnvKind kind;
  // The value used when unset or empty: "0"/"1" for a flag, digits for an integer, one of
  // `choices` or "" otherwise. Words (e.g. "number of cores") mean the caller computes it.
  const char* default_value;
  int64_t min = 0;           // integers: the smallest value accepted
  const char* choices = "";  // choice: the accepted values, separated by '|'
  const char* meaning = "";
  const char* documented = "";  // the decision (or file) that explains it
  const char* read_by = "library";
};

namespace env {

std::span<const EnvSpec> table();
const EnvSpec& spec(EnvVar var);
const EnvSpec* find(std::string_view name);  // nullptr: not a tessera switch

// Set to a non-empty value (an empty value counts as unset everywhere).
bool is_set(EnvVar var);
// Flags accept 1/0, true/false, yes/no, on/off (any case) or an integer (non-zero is on).
bool flag(EnvVar var);
// The value, else the table's default; nullopt when unset and the default is computed.
std::optional<int64_t> integer(EnvVar var);
// The value, or "" when unset.
std::string string(EnvVar var);
// One of the spec's choices, or its default ("" for none) when unset.
std::string choice(EnvVar var);

// Throws the standard error for a value the caller's own parser rejects.
[[noreturn]] void malformed(EnvVar var, std::string_view value, std::string_view expected);
// Parses every library switch that is set, so a front end reports a bad one before any work.
void validate();

// A variable tessera only inspects and does not own (OMP_WAIT_POLICY, GOMP_SPINCOUNT).
const char* raw(const char* name);

}  // namespace env
}  // namespace tessera
