// The environment switches table and its parsers (env.h). README.md's "Environment" table
// mirrors this one; tests/env_test.cpp checks that every TESSERA_* name in the tree is here.
#include "runtime/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "runtime/error.h"

namespace tessera {
namespace env {
namespace {

using K = EnvKind;
constexpr int64_t kMaxInt = 2147483647;

// Order follows EnvVar (spec() indexes it).
const EnvSpec kTable[] = {
    {EnvVar::num_threads, "TESSERA_NUM_THREADS", K::integer, "number of cores", 1, "",
     "kernel threads (the one OpenMP pool); at 1 the CLI keeps OpenMP's default wait policy",
     "decision 0006"},
    {EnvVar::min_parallel_work, "TESSERA_MIN_PARALLEL_WORK", K::integer, "1048576", 1, "",
     "multiply-adds below which a GEMM or attention stays on one thread", "decision 0017"},
    {EnvVar::cpu_isa, "TESSERA_CPU_ISA", K::choice, "", 0,
     "scalar|avx2|avx512|avx512_bf16|amx_bf16",
     "caps the kernels (and oneDNN's) picked at run time, to test every path on one machine",
     "decision 0018"},
    {EnvVar::defer_and_fuse, "TESSERA_DEFER_AND_FUSE", K::flag, "0", 0, "",
     "start in deferred-and-fused mode (the CLI's --mode overrides it)", "decision 0009"},
    {EnvVar::defer_max_nodes, "TESSERA_DEFER_MAX_NODES", K::integer, "4096", 1, "",
     "deferred mode: run a segment once it has this many ops", "decision 0009"},
    {EnvVar::defer_repeat_cut, "TESSERA_DEFER_REPEAT_CUT", K::flag, "1", 0, "",
     "deferred mode: cut a segment where its ops start repeating (0: only at syncs and the limit)",
     "decision 0009"},
    {EnvVar::defer_no_fuse, "TESSERA_DEFER_NO_FUSE", K::flag, "0", 0, "",
     "deferred and compiled modes plan without fusing, to bisect numerical differences",
     "decision 0009"},
    {EnvVar::defer_no_replay, "TESSERA_DEFER_NO_REPLAY", K::flag, "0", 0, "",
     "deferred mode: record every segment instead of replaying a cached one", "decision 0009"},
    {EnvVar::async_dispatch, "TESSERA_ASYNC_DISPATCH", K::flag, "0", 0, "",
     "run kernels on a worker thread, the caller queueing them", "decision 0009"},
    {EnvVar::launch_blocking, "TESSERA_LAUNCH_BLOCKING", K::flag, "0", 0, "",
     "wait for every op to finish (errors surface at the op that raised them)", "decision 0009"},
    {EnvVar::compile, "TESSERA_COMPILE", K::choice, "", 0, "full|regional",
     "compile a model with repeated blocks when it loads (whole, or one program per block class)",
     "decision 0010"},
    {EnvVar::cache_dir, "TESSERA_CACHE_DIR", K::string, "", 0, "",
     "folder for compiled plans on disk, so a second process skips planning", "decision 0010"},
    {EnvVar::packed_weight_cache_mb, "TESSERA_PACKED_WEIGHT_CACHE_MB", K::integer,
     "a third of memory, at least 4096", 0, "", "MiB of repacked GEMM weights kept (LRU)",
     "decision 0002"},
    {EnvVar::sdpa_qblock, "TESSERA_SDPA_QBLOCK", K::integer, "256", 1, "",
     "query rows per block of the oneDNN-tiled attention (tuning)", "decision 0003"},
    {EnvVar::sdpa_f32_products, "TESSERA_SDPA_F32_PRODUCTS", K::string, "6,6", 0, "",
     "f32 AMX attention: bf16 products per Q K^T[, P V] product, each 3, 4 or 6", "decision 0003"},
    {EnvVar::skip_sanitize, "TESSERA_SKIP_SANITIZE", K::flag, "0", 0, "",
     "scripts/test.sh: skip the ASan/UBSan pass (only the value 1 skips)", "README.md",
     "scripts/test.sh"},
    {EnvVar::fuzz_seconds, "TESSERA_FUZZ_SECONDS", K::integer, "30", 1, "",
     "seconds the safetensors header fuzzer runs", "tests/fuzz.cmake", "tests/fuzz/run_fuzz.sh"},
    {EnvVar::fuzz_cxx, "TESSERA_FUZZ_CXX", K::string, "clang++-14", 0, "",
     "the compiler that builds the fuzzer", "tests/fuzz/run_fuzz.sh", "tests/fuzz/run_fuzz.sh"},
    {EnvVar::conformance_seed, "TESSERA_CONFORMANCE_SEED", K::integer, "20261218", 0, "",
     "draws other backend conformance cases", "decision 0020", "tests"},
    {EnvVar::conformance_all, "TESSERA_CONFORMANCE_ALL", K::flag, "0", 0, "",
     "conformance: run on after the first failing case (set at all: on)", "decision 0020", "tests"},
    {EnvVar::conformance_verbose, "TESSERA_CONFORMANCE_VERBOSE", K::flag, "0", 0, "",
     "conformance: name each run before it starts (set at all: on)", "decision 0020", "tests"},
    {EnvVar::conformance_known_bugs, "TESSERA_CONFORMANCE_KNOWN_BUGS", K::flag, "0", 0, "",
     "conformance: run the modes skipped for a known bug (set at all: on)", "decision 0020",
     "tests"},
    {EnvVar::pipeline_device, "TESSERA_PIPELINE_DEVICE", K::string, "cpu", 0, "",
     "the FLUX.1 pipeline goldens run on this device (tests/xla.cmake: xla:cpu)", "decision 0030",
     "tests"},
    {EnvVar::pjrt_plugin, "TESSERA_PJRT_PLUGIN", K::string, "", 0, "",
     "the XLA CPU PJRT plugin (.so) behind xla:cpu; none: no xla:cpu device (default: the "
     "wheel scripts/setup_xla.sh installs)",
     "decision 0030"},
    {EnvVar::pjrt_cuda_plugin, "TESSERA_PJRT_CUDA_PLUGIN", K::string, "", 0, "",
     "the XLA CUDA PJRT plugin (.so) behind xla:cuda (default: none)", "decision 0030"},
    {EnvVar::libtpu_path, "TESSERA_LIBTPU_PATH", K::string, "", 0, "",
     "libtpu.so behind tpu (default: the one scripts/setup_xla.sh installs with TESSERA_LIBTPU=1)",
     "decision 0030"},
    {EnvVar::xla_fallback, "TESSERA_XLA_FALLBACK", K::flag, "1", 0, "",
     "XLA devices run an op without a StableHLO lowering on the CPU through host copies (0: "
     "such an op is an error naming it)",
     "decision 0032"},
    {EnvVar::xla_graphs, "TESSERA_XLA_GRAPHS", K::flag, "1", 0, "",
     "XLA devices run a deferred segment or compiled program as one executable (0: op by op)",
     "decision 0033"},
    {EnvVar::xla_donate, "TESSERA_XLA_DONATE", K::flag, "1", 0, "",
     "XLA devices donate a buffer whose contents are dead to the result that replaces it (0: "
     "every result gets a new buffer)",
     "decision 0050"},
    {EnvVar::xla_cpu_devices, "TESSERA_XLA_CPU_DEVICES", K::integer, "1", 1, "",
     "devices of the XLA CPU plugin behind xla:cpu (its cpu_device_count); SPMD programs "
     "(--tp N on xla:cpu) raise it to N when the plugin has not started yet",
     "decision 0060"},
    {EnvVar::xla_setup, "TESSERA_XLA", K::flag, "1", 0, "",
     "scripts/setup.sh: install the XLA CPU plugin (0: skip it; the XLA backend is not built)",
     "decision 0030", "scripts/setup_xla.sh"},
    {EnvVar::libtpu_setup, "TESSERA_LIBTPU", K::flag, "0", 0, "",
     "scripts/setup.sh: also install libtpu (Google's terms; never shipped)", "decision 0030",
     "scripts/setup_xla.sh"},
    {EnvVar::xla_dir, "TESSERA_XLA_DIR", K::string, "~/.cache/tessera/xla", 0, "",
     "where scripts/setup_xla.sh installs the XLA plugins (CMake's TESSERA_XLA_DIR: where it "
     "looks)",
     "decision 0030", "scripts/setup_xla.sh"},
    {EnvVar::tp_timeout, "TESSERA_TP_TIMEOUT", K::integer, "10", 1, "",
     "seconds without a heartbeat after which a tensor-parallel rank is declared failed (every "
     "rank then exits naming it)",
     "decision 0040"},
    {EnvVar::launch_dir, "TESSERA_LAUNCH_DIR", K::string, "", 0, "",
     "set by tessera launch for its ranks: rank 0 marks there that every rank finished (mpirun "
     "with --enable-recovery exits 0 whatever the ranks did)",
     "decision 0040"},
};

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Base-10 integer, the whole string; nullopt when it is not one or overflows.
std::optional<int64_t> parse_int(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return int64_t(v);
}

const char* value_of(const EnvSpec& s) {
  const char* v = std::getenv(s.name);
  return v && *v ? v : nullptr;
}

const EnvSpec& checked(EnvVar var, EnvKind kind) {
  const EnvSpec& s = spec(var);
  TESSERA_CHECK(s.kind == kind, "[env] ", s.name, " is not read as that kind");
  return s;
}

bool parse_flag(const EnvSpec& s, const std::string& v) {
  const std::string l = lower(v);
  if (l == "true" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "no" || l == "off") return false;
  if (auto n = parse_int(v)) return *n != 0;
  malformed(s.var, v, "expected 1/0, true/false, yes/no or on/off");
}

int64_t parse_integer(const EnvSpec& s, const std::string& v) {
  const auto n = parse_int(v);
  const int64_t max = s.var == EnvVar::num_threads ? kMaxInt : INT64_MAX;
  if (!n || *n < s.min || *n > max)
    malformed(s.var, v,
              s.min == 1   ? "expected a positive integer"
              : s.min == 0 ? "expected a non-negative integer"
                           : "expected an integer");
  return *n;
}

bool is_choice(const EnvSpec& s, std::string_view v) {
  std::string_view c = s.choices;
  while (!c.empty()) {
    const size_t bar = c.find('|');
    if (c.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) break;
    c.remove_prefix(bar + 1);
  }
  return false;
}

}  // namespace

std::span<const EnvSpec> table() {
  return kTable;
}

const EnvSpec& spec(EnvVar var) {
  return kTable[size_t(var)];
}

const EnvSpec* find(std::string_view name) {
  for (const EnvSpec& s : kTable)
    if (name == s.name) return &s;
  return nullptr;
}

bool is_set(EnvVar var) {
  return value_of(spec(var)) != nullptr;
}

bool flag(EnvVar var) {
  const EnvSpec& s = checked(var, EnvKind::flag);
  const char* v = value_of(s);
  return parse_flag(s, v ? v : s.default_value);
}

std::optional<int64_t> integer(EnvVar var) {
  const EnvSpec& s = checked(var, EnvKind::integer);
  if (const char* v = value_of(s)) return parse_integer(s, v);
  return parse_int(s.default_value);  // nullopt for a computed default
}

std::string string(EnvVar var) {
  const EnvSpec& s = checked(var, EnvKind::string);
  const char* v = value_of(s);
  return v ? v : "";
}

std::string choice(EnvVar var) {
  const EnvSpec& s = checked(var, EnvKind::choice);
  const char* v = value_of(s);
  if (!v) return s.default_value;
  if (!is_choice(s, v)) {
    std::string expected = "expected one of ";
    for (char c : std::string_view(s.choices)) {
      if (c == '|')
        expected += ", ";
      else
        expected += c;
    }
    malformed(var, v, expected);
  }
  return v;
}

void malformed(EnvVar var, std::string_view value, std::string_view expected) {
  TESSERA_FAIL("[env] ", spec(var).name, "=", value, ": ", expected);
}

void validate() {
  for (const EnvSpec& s : kTable) {
    if (std::string_view(s.read_by) != "library" || !is_set(s.var)) continue;
    switch (s.kind) {
      case EnvKind::flag:
        flag(s.var);
        break;
      case EnvKind::integer:
        integer(s.var);
        break;
      case EnvKind::choice:
        choice(s.var);
        break;
      case EnvKind::string:
        break;  // free text (its reader checks a structured one)
    }
  }
}

const char* raw(const char* name) {
  return std::getenv(name);
}

}  // namespace env
}  // namespace tessera
