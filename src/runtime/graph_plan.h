// The recorded graph and its plan, shared by deferred mode (graph.cpp) and compiled mode
// (compile.cpp): nodes as recorded at dispatch(), fusion grouping, steps with release points.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/graph.h"

namespace tessera::graph_detail {

// Pending outputs made while tracing a compiled function carry this segment id; placeholders
// (the traced function's inputs) have node = -2 - input index.
constexpr uint64_t kTraceSegment = ~uint64_t(0);

struct Node {
  PrimitivePtr prim;
  std::vector<Tensor> inputs;  // pending inputs are private impl copies (for liveness counts)
  std::vector<int64_t> src_node;
  std::vector<int> src_out;
  std::vector<int> placeholder;  // traces only: input index of the traced function, or -1
  std::vector<TensorSpec> specs;
  std::vector<std::shared_ptr<PendingOutput>> outs;
  Device device;
};

// One step of a plan: a single node, or a fused kernel over several nodes.
struct Step {
  int64_t node = -1;
  PrimitivePtr fused;
  std::vector<std::pair<int64_t, int>> ext_inputs;  // (node, input) feeding the kernel
  std::vector<std::pair<int64_t, int>> outputs;     // (node, out) the kernel writes
  std::vector<std::pair<int64_t, int>> release;     // storages dropped after this step
  int64_t fused_ops = 0;
};

using Grouping = std::vector<std::vector<int64_t>>;  // units in run order: one node or a group

struct Plan {
  std::vector<Step> steps;
  Grouping grouping;
  int64_t fused_kernels = 0, fused_ops = 0, allocations = 0;
};

// Pending tensors for the outputs of node `node` (about to be appended to its graph), recorded
// in n.outs; shared by deferred recording and tracing.
std::vector<Tensor> add_pending_outputs(Node& n, const std::vector<TensorSpec>& outputs,
                                        uint64_t segment, int64_t node, const Device& device);
// Fusion grouping (the expensive half of planning): which nodes run as one fused kernel.
Grouping group_nodes(const std::vector<Node>& nodes, bool fuse);
// Steps, fused kernels and release points (liveness) for a grouping. live[i][o]: output o of
// node i is read after the graph ran (held by the user or returned).
std::shared_ptr<Plan> plan_from_grouping(const std::vector<Node>& nodes,
                                         const std::vector<std::vector<char>>& live,
                                         Grouping grouping);
// Structural fingerprint: op names + attributes, edges, input views, output liveness/specs.
uint64_t structural_hash(const std::vector<Node>& nodes,
                         const std::vector<std::vector<char>>& live);

// Compiled mode's static memory plan: each value that does not leave the program gets a buffer
// slot (the allocator's block size), reused once its last reader ran.
struct MemoryPlan {
  std::vector<int> slot_of;  // per flat value: buffer slot, or -1 (allocated per run)
  std::vector<size_t> slot_bytes;
};
void plan_memory(const std::vector<Node>& nodes, const Plan& plan,
                 const std::vector<int64_t>& value_base,
                 const std::vector<std::vector<char>>& live, MemoryPlan* out);
// Checks of a plan read from disk: sizes fit, no slot holds two live values; the grouping covers
// every node once, in dependency order, fusing only fusible nodes of one shape.
bool memory_plan_valid(const std::vector<Node>& nodes, const Plan& plan,
                       const std::vector<int64_t>& value_base,
                       const std::vector<std::vector<char>>& live, const MemoryPlan& p);
bool grouping_valid(const Grouping& g, const std::vector<Node>& nodes);

// While alive, ops dispatched by kernels run inline (in_graph_execution() is true).
struct ExecutionScope {
  ExecutionScope();
  ~ExecutionScope();
  ExecutionScope(const ExecutionScope&) = delete;
  ExecutionScope& operator=(const ExecutionScope&) = delete;
};

// Compiled mode's trace hooks (compile.cpp): while a trace runs on this thread, dispatch()
// records into it, and a host read of a traced tensor is a graph break.
bool tracing();
std::vector<Tensor> trace_record(PrimitivePtr p, const std::vector<Tensor>& inputs,
                                 const std::vector<TensorSpec>& outputs, const Device& device);
[[noreturn]] void trace_host_read(const TensorImpl& impl);

}  // namespace tessera::graph_detail
