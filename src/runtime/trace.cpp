#include "runtime/trace.h"

namespace tessera::graph_detail {
namespace {

struct Trace {
  std::string where;
  std::vector<Node> nodes;
};
thread_local Trace* t_trace = nullptr;

struct TraceScope {
  explicit TraceScope(Trace* t) : saved(t_trace) { t_trace = t; }
  ~TraceScope() { t_trace = saved; }
  Trace* saved;
};

}  // namespace

std::vector<Tensor> trace_function(
    const std::string& where, const std::vector<Tensor>& inputs,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    std::vector<Node>* nodes) {
  Trace trace;
  trace.where = where;
  std::vector<Tensor> placeholders;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) {
      placeholders.emplace_back();
      continue;
    }
    auto po = std::make_shared<PendingOutput>();
    po->segment = kTraceSegment;
    po->node = -2 - int64_t(k);
    auto impl = std::make_shared<TensorImpl>();
    impl->pending = po;
    impl->shape = inputs[k].shape();
    impl->strides = contiguous_strides(impl->shape);
    impl->dtype = inputs[k].dtype();
    impl->device = inputs[k].device();
    placeholders.emplace_back(std::move(impl));
  }
  std::vector<Tensor> outs;
  try {
    TraceScope scope(&trace);
    outs = fn(placeholders);
  } catch (...) {
    placeholders.clear();
    throw;
  }
  *nodes = std::move(trace.nodes);
  return outs;
}

bool tracing() {
  return t_trace != nullptr;
}

std::vector<Tensor> trace_record(PrimitivePtr p, const std::vector<Tensor>& inputs,
                                 const std::vector<TensorSpec>& outputs, const Device& device) {
  Trace& tr = *t_trace;
  Node n;
  n.device = device;
  n.specs = outputs;
  for (const auto& t : inputs) {
    const auto& impl = t.impl();
    if (!impl->storage && impl->pending && impl->pending->segment == kTraceSegment) {
      const PendingOutput& po = *impl->pending;
      n.inputs.push_back(Tensor(std::make_shared<TensorImpl>(*impl)));
      n.src_node.push_back(po.node >= 0 ? po.node : -1);
      n.src_out.push_back(po.node >= 0 ? po.out : 0);
      n.placeholder.push_back(po.node >= 0 ? -1 : int(-2 - po.node));
      continue;
    }
    t.storage();  // made before the trace (or eagerly inside it): a constant of the program
    n.inputs.push_back(t);
    n.src_node.push_back(-1);
    n.src_out.push_back(0);
    n.placeholder.push_back(-1);
  }
  std::vector<Tensor> result =
      add_pending_outputs(n, outputs, kTraceSegment, int64_t(tr.nodes.size()), device);
  n.prim = std::move(p);
  tr.nodes.push_back(std::move(n));
  return result;
}

void trace_host_read(const TensorImpl& impl) {
  const int64_t node = impl.pending->node;
  std::string at;
  if (t_trace && node >= 0 && node < int64_t(t_trace->nodes.size()))
    at = std::string("the output of op '") + t_trace->nodes[node].prim->name() + "' (node " +
         std::to_string(node) + ")";
  else
    at = "input " + std::to_string(-2 - node) + " of the traced function";
  throw GraphBreak(detail::concat("[compile] ", t_trace ? t_trace->where : "",
                                  ": forward reads a traced tensor on the host at ", at, ", ",
                                  dtype_name(impl.dtype), shape_str(impl.shape),
                                  ": compiled mode needs the whole forward as one graph "
                                  "(fullgraph=true); read it outside forward or run eagerly"));
}

}  // namespace tessera::graph_detail
