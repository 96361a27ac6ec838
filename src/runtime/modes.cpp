#include "runtime/modes.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "runtime/env.h"
#include "runtime/graph.h"
#include "runtime/primitive.h"
#include "runtime/backend.h"

namespace tessera {
namespace {

std::atomic<int>& mode_state() {
  static std::atomic<int> m{env::flag(EnvVar::defer_and_fuse) ? int(EagerMode::DeferAndFuse)
                                                               : int(EagerMode::DeferNever)};
  return m;
}
std::atomic<bool>& async_state() {
  static std::atomic<bool> a{env::flag(EnvVar::async_dispatch)};
  return a;
}
std::atomic<bool>& blocking_state() {
  static std::atomic<bool> b{env::flag(EnvVar::launch_blocking)};
  return b;
}

std::mutex g_mu;
ModeStats g_stats;

}  // namespace

void set_eager_mode(EagerMode mode) {
  if (eager_mode() == EagerMode::DeferAndFuse && mode != EagerMode::DeferAndFuse)
    materialize_pending_graph();
  mode_state() = int(mode);
}
EagerMode eager_mode() {
  return EagerMode(mode_state().load(std::memory_order_relaxed));
}
const char* eager_mode_name(EagerMode mode) {
  return mode == EagerMode::DeferAndFuse ? "defer" : "eager";
}

void set_async_dispatch(bool on) {
  if (!on) synchronize_all_devices();
  async_state() = on;
}
bool async_dispatch() {
  return async_state().load(std::memory_order_relaxed);
}
void set_launch_blocking(bool on) {
  if (on) synchronize_all_devices();
  blocking_state() = on;
}
bool launch_blocking() {
  return blocking_state().load(std::memory_order_relaxed);
}

ModeStats mode_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  ModeStats s = g_stats;
  s.mode = s.compiled_runs > 0 ? (s.regional ? "compile-regional" : "compile")
                               : eager_mode_name(eager_mode());
  s.ops_dispatched = dispatch_stats().ops_dispatched;
  return s;
}

void reset_mode_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats = ModeStats();
  reset_dispatch_stats();
}

std::string mode_stats_json(const ModeStats& s) {
  std::ostringstream os;
  os << "{\"mode\": \"" << s.mode << "\", \"compiles\": " << s.compiles
     << ", \"cache_hits\": " << s.cache_hits << ", \"compile_seconds\": " << s.compile_seconds
     << ", \"fused_kernels\": " << s.fused_kernels << ", \"ops_dispatched\": " << s.ops_dispatched
     << ", \"segments\": " << s.segments << ", \"replayed_segments\": " << s.replayed_segments
     << ", \"program_compiles\": " << s.program_compiles
     << ", \"program_cache_hits\": " << s.program_cache_hits
     << ", \"compiled_runs\": " << s.compiled_runs << ", \"disk_cache_hits\": " << s.disk_cache_hits
     << ", \"regional\": " << (s.regional ? "true" : "false") << "}";
  return os.str();
}

namespace detail {
void note_compile(double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.compiles++;
  g_stats.compile_seconds += seconds;
}
void note_cache_hit() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.cache_hits++;
}
void note_fused_kernels(int64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.fused_kernels += n;
}
void note_segment(bool replayed) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.segments++;
  g_stats.replayed_segments += replayed;
}
void note_program_built() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.program_compiles++;
}
void note_program_cache_hit() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.program_cache_hits++;
}
void note_compiled_run(bool regional, int64_t fused_kernels) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.compiled_runs++;
  g_stats.regional = g_stats.regional || regional;
  g_stats.fused_kernels += fused_kernels;
}
void note_disk_cache_hit() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.disk_cache_hits++;
}
}  // namespace detail

}  // namespace tessera
