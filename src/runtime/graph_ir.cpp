// The recorded graph shared by deferred and compiled mode (runtime/graph_plan.h): pending
// outputs of recorded nodes, the structural hash, and the executing-thread marker.
#include "runtime/graph_plan.h"

namespace tessera {
namespace {
thread_local int t_executing = 0;
}  // namespace

bool in_graph_execution() { return t_executing > 0; }

namespace graph_detail {

ExecutionScope::ExecutionScope() { ++t_executing; }
ExecutionScope::~ExecutionScope() { --t_executing; }

std::vector<Tensor> add_pending_outputs(Node& n, const std::vector<TensorSpec>& outputs,
                                        uint64_t segment, int64_t node, const Device& device) {
  std::vector<Tensor> result;
  result.reserve(outputs.size());
  n.outs.reserve(outputs.size());
  for (size_t o = 0; o < outputs.size(); ++o) {
    auto po = std::make_shared<PendingOutput>();
    po->segment = segment;
    po->node = node;
    po->out = int(o);
    auto impl = std::make_shared<TensorImpl>();
    impl->pending = po;
    impl->shape = outputs[o].shape;
    impl->strides = contiguous_strides(outputs[o].shape);
    impl->dtype = outputs[o].dtype;
    impl->device = device;
    n.outs.push_back(std::move(po));
    result.emplace_back(std::move(impl));
  }
  return result;
}

uint64_t structural_hash(const std::vector<Node>& nodes,
                         const std::vector<std::vector<char>>& live) {
  Hasher h;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    h.add_string(n.prim->name());
    n.prim->hash_attributes(h);
    h.add(uint64_t(n.device.type));
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const Tensor& t = n.inputs[j];
      h.add(uint64_t(n.src_node[j] + 1));
      h.add(uint64_t(n.src_out[j]));
      if (!n.placeholder.empty()) h.add(uint64_t(n.placeholder[j] + 1));
      h.add(uint64_t(t.dtype()));
      h.add(uint64_t(t.offset()));
      for (auto d : t.shape()) h.add(uint64_t(d));
      for (auto d : t.strides()) h.add(uint64_t(d));
    }
    for (size_t o = 0; o < n.outs.size(); ++o) {
      h.add(uint64_t(live[i][o]));
      h.add(uint64_t(n.specs[o].dtype));
      for (auto d : n.specs[o].shape) h.add(uint64_t(d));
    }
  }
  return h.value();
}

}  // namespace graph_detail
}  // namespace tessera
