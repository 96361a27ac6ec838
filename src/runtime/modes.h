// Execution modes and their statistics. Strict eager (DeferNever) runs each op on the device
// stream; DeferAndFuse records ops into a graph and, at a sync point, fuses and runs the
// segment (runtime/graph.h). See docs/decisions/0009-execution-modes.md.
#pragma once
#include <cstdint>
#include <string>

namespace tessera {

enum class EagerMode : uint8_t { DeferNever, DeferAndFuse };

// Default: DeferAndFuse when TESSERA_DEFER_AND_FUSE=1, else DeferNever. Switching away from
// DeferAndFuse materialises what was recorded.
void set_eager_mode(EagerMode mode);
EagerMode eager_mode();
const char* eager_mode_name(EagerMode mode);  // "eager", "defer"

// Strict eager on an asynchronous stream (one worker thread). Off by default on CPU (decision
// 0009); TESSERA_ASYNC_DISPATCH=1 turns it on. Turning it off synchronizes first.
void set_async_dispatch(bool on);
bool async_dispatch();
// TESSERA_LAUNCH_BLOCKING=1: every op runs synchronously, so an error appears at its op.
void set_launch_blocking(bool on);
bool launch_blocking();

struct ModeStats {
  std::string mode;               // "eager", "defer", "compile" or "compile-regional"
  int64_t compiles = 0;           // segment plans built (fusion + memory plan)
  int64_t cache_hits = 0;         // segments that reused a cached plan
  double compile_seconds = 0;     // time spent building plans
  int64_t fused_kernels = 0;      // fused kernels run (each replaces two or more ops)
  int64_t ops_dispatched = 0;     // ops that went through dispatch()
  int64_t segments = 0;           // deferred segments materialised
  int64_t replayed_segments = 0;  // of which replayed from a cached segment (no nodes built)
  // Compiled mode (runtime/compile.h): compiles/cache_hits above count its programs too;
  // these count only them (deferred segments may run around regional programs).
  int64_t program_compiles = 0;    // programs built (one per function and input signature)
  int64_t program_cache_hits = 0;  // calls that reused a program
  int64_t compiled_runs = 0;       // calls that ran a compiled program
  int64_t disk_cache_hits = 0;     // plans read from TESSERA_CACHE_DIR instead of planned
  bool regional = false;           // programs are per repeated block (compile_repeated_blocks)
};
ModeStats mode_stats();
void reset_mode_stats();
// {"mode": ..., "compiles": ..., ...} for the CLI's --report.
std::string mode_stats_json(const ModeStats& s);

namespace detail {
// Counters bumped by the graph executor.
void note_compile(double seconds);
void note_cache_hit();
void note_fused_kernels(int64_t n);
void note_segment(bool replayed);
// Counters bumped by compiled programs.
void note_program_built();
void note_program_cache_hit();
void note_compiled_run(bool regional, int64_t fused_kernels);
void note_disk_cache_hit();
}  // namespace detail

}  // namespace tessera
