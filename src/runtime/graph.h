// Deferred-and-fused mode: dispatch() records ops into the current segment and returns pending
// tensors (no storage). A sync point materialises the segment: it is fingerprinted, planned
// once per fingerprint (fusion + memory plan, runtime/fusion.h) and run.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/primitive.h"

namespace tessera {

// What a pending tensor views: output `out` of node `node` of segment `segment`. Views of a
// pending tensor share it and resolve to its storage once the segment ran.
struct PendingOutput {
  std::shared_ptr<Storage> storage;
  uint64_t segment = 0;
  int64_t node = -1;
  int out = 0;
};

// Records p (deferred mode); returns pending tensors of the given specs.
std::vector<Tensor> record_op(PrimitivePtr p, const std::vector<Tensor>& inputs,
                              const std::vector<TensorSpec>& outputs, const Device& device);
// Runs everything recorded so far (a sync point).
void materialize_pending_graph();
// Gives impl its storage, materialising its segment if needed.
void resolve_pending(TensorImpl& impl);
// True while a segment runs (ops dispatched by kernels then run eagerly, inline).
bool in_graph_execution();

// What the last materialised segment did, for tests and reports.
struct SegmentReport {
  int64_t nodes = 0;
  int64_t kernels = 0;        // kernels run (a fused kernel counts once)
  int64_t fused_kernels = 0;  // of which fused
  int64_t fused_ops = 0;      // ops folded into fused kernels
  int64_t allocations = 0;    // output buffers allocated by the plan
  bool cache_hit = false;
  bool replayed = false;  // recorded by guarded replay of the cached segment (no nodes built)
};
SegmentReport last_segment_report();

// Materialise after this many recorded ops (TESSERA_DEFER_MAX_NODES, default 4096).
void set_defer_node_limit(int64_t n);
// The repeated-suffix heuristic (cut where the last L ops repeat the L before, 3 <= L <= 128).
void set_repeat_heuristic(bool on);
// Fusion on/off (TESSERA_DEFER_NO_FUSE=1 turns it off), to bisect numerical differences.
void set_fusion_enabled(bool on);
// Guarded replay of cached segments (TESSERA_DEFER_NO_REPLAY=1 turns it off): once a segment was
// planned, the ops of the segment predicted to come next are checked against it as they arrive
// and recorded without building nodes; a mismatch falls back to normal recording.
void set_segment_replay(bool on);
void clear_segment_cache();

}  // namespace tessera
