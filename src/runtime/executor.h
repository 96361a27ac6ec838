// The one plan executor of deferred segments and compiled programs: each step's argument lists
// are built once (views, prepared kernels), so a run only binds storages, allocates the outputs
// that have no static slot, runs the kernels through the device's backend and drops values at
// their release points.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/backend.h"
#include "runtime/graph_plan.h"

namespace tessera::graph_detail {

// What one run binds: the recorded primitives (deferred mode replays fresh ones; null: the
// plan's), the external inputs' storages and, for compiled programs, their view offsets.
struct ExecBinding {
  const std::vector<PrimitivePtr>* prims = nullptr;  // per node
  const std::vector<std::shared_ptr<Storage>>* ext = nullptr;
  const std::vector<int64_t>* ext_offset = nullptr;  // per external input, or null: 0
};

class Executable {
 public:
  // External inputs: a trace's placeholders (Node::placeholder; other storage inputs are
  // constants kept in the step), else every input without a producer, in node order.
  // slot_of/slot_bytes: the static memory plan (empty: every output allocated per run).
  void build(const std::vector<Node>& nodes, const Plan& plan, std::vector<int64_t> value_base,
             std::vector<int> slot_of = {}, std::vector<size_t> slot_bytes = {},
             const Device& slot_device = Device::cpu());
  int64_t num_values() const { return value_base_.empty() ? 0 : value_base_.back(); }
  int64_t num_ext() const { return n_ext_; }
  int64_t value_index(int64_t node, int out) const { return value_base_[node] + out; }
  // Runs every step (ops dispatched by kernels run inline). After it, take(v) hands out value v
  // (null when released); on an error the bound storages are dropped and it rethrows.
  void run(const ExecBinding& b);
  std::shared_ptr<Storage> take(int64_t v) { return std::move(values_[v]); }
  const std::shared_ptr<Storage>& value(int64_t v) const { return values_[v]; }
  void clear_values() { values_.clear(); }

 private:
  struct Arg {
    int64_t value = -1;  // flat value read, or
    int64_t ext = -1;    // external input (else: a constant, bound at build)
    int64_t offset = 0;  // the recorded view's offset
  };
  struct Step {
    int64_t node = -1;  // single op (the binding's primitive when it has them), else fused
    PrimitivePtr prim;  // the template's op or the fused kernel
    std::vector<Tensor> ins, outs;
    std::vector<Arg> args;
    std::vector<int64_t> out_values;
    std::vector<char> fresh;  // per output: allocated per run (else a static slot)
    std::vector<size_t> out_bytes;
    std::vector<int64_t> release;
    Backend* backend = nullptr;
    std::unique_ptr<PreparedKernel> kernel;
  };
  void unbind();
  void prepare_graph();
  std::unique_ptr<GraphKernel> graph_;  // the whole plan as one kernel (backend.h), if any
  std::vector<Step> steps_;
  std::vector<int64_t> value_base_;
  int64_t n_ext_ = 0;
  std::vector<std::shared_ptr<Storage>> slots_;
  std::vector<std::shared_ptr<Storage>> values_;  // per flat value, during a run
};

}  // namespace tessera::graph_detail
