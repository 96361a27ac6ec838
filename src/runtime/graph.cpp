#include "runtime/graph.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "runtime/error.h"
#include "runtime/fusion.h"
#include "runtime/graph_plan.h"
#include "runtime/modes.h"
#include "runtime/stream.h"

namespace tessera {
namespace graph_detail {
namespace {

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

struct State {
  std::recursive_mutex mu;
  std::vector<Node> nodes;
  uint64_t segment = 1;
  int64_t node_limit = env_int("TESSERA_DEFER_MAX_NODES", 4096);
  bool repeat = env_int("TESSERA_DEFER_REPEAT_CUT", 1) != 0;
  bool fuse = env_int("TESSERA_DEFER_NO_FUSE", 0) == 0;
  std::deque<uint64_t> window;  // op hashes, for the repeated-suffix heuristic
  int64_t last_period = 0;
  std::unordered_map<uint64_t, std::shared_ptr<const Plan>> cache;
  SegmentReport report;
};

State& state() {
  static State* s = new State();  // never destroyed: pending tensors may outlive main
  return *s;
}

thread_local int t_executing = 0;

uint64_t op_hash(const Primitive& p, const std::vector<Tensor>& inputs) {
  Hasher h;
  h.add_string(p.name());
  p.hash_attributes(h);
  for (const auto& t : inputs) {
    h.add(uint64_t(t.dtype()));
    for (auto d : t.shape()) h.add(uint64_t(d));
  }
  return h.value();
}

// Cut where the last L ops repeat the L before them (3 <= L <= 128), once the segment holds at
// least L ops, so repeated blocks become identical segments. Deterministic in the op stream.
bool repeated_suffix(State& s, int64_t seg_len) {
  const int64_t n = int64_t(s.window.size());
  auto repeats = [&](int64_t L) {
    if (L > seg_len || 2 * L > n) return false;
    for (int64_t i = 1; i <= L; ++i)
      if (s.window[n - i] != s.window[n - i - L]) return false;
    return true;
  };
  if (s.last_period && repeats(s.last_period)) return true;
  for (int64_t L = 3; L <= 128 && 2 * L <= n; ++L) {
    if (L != s.last_period && repeats(L)) {
      s.last_period = L;
      return true;
    }
  }
  return false;
}

bool is_direct(const Tensor& t, const TensorSpec& spec) {
  return t.offset() == 0 && t.shape() == spec.shape && t.is_contiguous();
}

}  // namespace

Grouping group_nodes(const std::vector<Node>& nodes, bool fuse) {
  const int64_t nn = int64_t(nodes.size());
  std::vector<int64_t> group_of(size_t(nn), -1);
  std::vector<char> rowwise(size_t(nn), 0), fusible(size_t(nn), 0);
  for (int64_t i = 0; i < nn; ++i) {
    bool rw = false;
    fusible[i] = fuse && nodes[i].device.type == DeviceType::cpu &&
                 is_fusible(*nodes[i].prim, nodes[i].inputs, nodes[i].specs, &rw);
    rowwise[i] = rw;
  }
  // Groups: one open group at a time. A node joins when it has the group's shape and reads
  // group values only directly; a node that depends on the group otherwise closes it; an
  // independent node runs before the group (emitted where the group closes), so no cycles.
  Grouping order;  // emitted units: one node or one group
  std::vector<int64_t> open;
  int64_t open_id = 0;
  Shape open_shape;
  auto close = [&] {
    if (!open.empty()) order.push_back(open);
    open.clear();
    ++open_id;
  };
  for (int64_t i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    bool dep = false, direct_only = true;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const int64_t s = n.src_node[j];
      if (s >= 0 && !open.empty() && group_of[s] == open_id) {
        dep = true;
        if (!is_direct(n.inputs[j], nodes[s].specs[n.src_out[j]])) direct_only = false;
      }
    }
    const bool same = !open.empty() && fusible[i] && n.specs[0].shape == open_shape;
    if (same && (!dep || (direct_only && !rowwise[i]))) {
      open.push_back(i);
      group_of[i] = open_id;
      continue;
    }
    if (dep) close();
    if (fusible[i] && open.empty()) {
      open.push_back(i);
      open_shape = n.specs[0].shape;
      group_of[i] = open_id;
      continue;
    }
    order.push_back({i});
  }
  close();
  return order;
}

std::shared_ptr<Plan> plan_from_grouping(const std::vector<Node>& nodes,
                                         const std::vector<std::vector<char>>& live,
                                         Grouping order) {
  const int64_t nn = int64_t(nodes.size());
  auto plan = std::make_shared<Plan>();
  // Consumers, for outputs needed outside a group and for release points.
  std::vector<std::vector<int64_t>> last_use(static_cast<size_t>(nn));
  for (int64_t i = 0; i < nn; ++i) last_use[i].assign(nodes[i].specs.size(), -1);
  std::vector<int64_t> unit_of(size_t(nn), -1);
  for (size_t u = 0; u < order.size(); ++u)
    for (int64_t i : order[u]) unit_of[i] = int64_t(u);
  std::vector<std::vector<char>> needed(static_cast<size_t>(nn));
  for (int64_t i = 0; i < nn; ++i) needed[i] = live[i];
  for (int64_t i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const int64_t s = n.src_node[j];
      if (s < 0) continue;
      auto& lu = last_use[s][n.src_out[j]];
      lu = std::max(lu, unit_of[i]);
      if (unit_of[s] != unit_of[i] || order[unit_of[i]].size() == 1 ||
          !is_direct(n.inputs[j], nodes[s].specs[n.src_out[j]]))
        needed[s][n.src_out[j]] = 1;
    }
  }
  std::vector<std::vector<std::pair<int64_t, int>>> release(order.size());
  for (int64_t i = 0; i < nn; ++i)
    for (size_t o = 0; o < nodes[i].specs.size(); ++o)
      if (!live[i][o]) release[std::max(last_use[i][o], unit_of[i])].push_back({i, int(o)});

  for (size_t u = 0; u < order.size(); ++u) {
    Step st;
    st.release = std::move(release[u]);
    const auto& members = order[u];
    if (members.size() == 1) {
      st.node = members[0];
      plan->allocations += int64_t(nodes[st.node].specs.size());
      plan->steps.push_back(std::move(st));
      continue;
    }
    std::vector<FusedInstr> prog;
    std::vector<int> out_values;
    std::string label = "fused(";
    std::unordered_map<int64_t, int> value_of;
    for (size_t m = 0; m < members.size(); ++m) {
      const int64_t i = members[m];
      const Node& n = nodes[i];
      std::vector<FusedOperand> ops;
      for (size_t j = 0; j < n.inputs.size(); ++j) {
        const int64_t s = n.src_node[j];
        if (s >= 0 && unit_of[s] == int64_t(u)) {
          ops.push_back({false, value_of.at(s)});
        } else {
          ops.push_back({true, int(st.ext_inputs.size())});
          st.ext_inputs.push_back({i, int(j)});
        }
      }
      append_fused_instr(prog, n.prim, n.inputs, ops, n.specs[0].dtype);
      value_of[i] = int(m);
      label += (m ? "," : "") + std::string(n.prim->name());
      if (needed[i][0]) {
        out_values.push_back(int(m));
        st.outputs.push_back({i, 0});
      }
    }
    label += ")";
    if (st.outputs.empty()) {  // nothing reads any value of the group: dead, skip it
      if (!st.release.empty()) plan->steps.push_back(std::move(st));
      continue;
    }
    st.fused = std::make_shared<FusedKernel>(std::move(prog), std::move(out_values), label);
    st.fused_ops = int64_t(members.size());
    plan->fused_kernels++;
    plan->fused_ops += st.fused_ops;
    plan->allocations += int64_t(st.outputs.size());
    plan->steps.push_back(std::move(st));
  }
  plan->grouping = std::move(order);
  return plan;
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

namespace {

// A resolved copy of a recorded input (storage filled in from its producer).
Tensor resolved(const Tensor& t) {
  const auto& impl = t.impl();
  if (impl->storage || !impl->pending) return t;
  auto r = std::make_shared<TensorImpl>(*impl);
  r->storage = impl->pending->storage;
  TESSERA_CHECK(r->storage, "[defer] internal: input of a recorded op has no storage");
  r->pending = nullptr;
  return Tensor(std::move(r));
}

void run_plan(const Plan& plan, std::vector<Node>& nodes) {
  for (const Step& st : plan.steps) {
    if (st.node >= 0) {
      Node& n = nodes[st.node];
      std::vector<Tensor> ins;
      ins.reserve(n.inputs.size());
      for (const auto& t : n.inputs) ins.push_back(resolved(t));
      std::vector<Tensor> outs;
      for (const auto& spec : n.specs)
        outs.push_back(Tensor::empty(spec.shape, spec.dtype, n.device));
      switch (n.device.type) {
        case DeviceType::cpu:
          n.prim->eval_cpu(ins, outs);
          break;
        case DeviceType::cuda:
          n.prim->eval_cuda(ins, outs);
          break;
        default:
          TESSERA_FAIL("[", n.prim->name(), "] no backend for device ", n.device.str());
      }
      for (size_t o = 0; o < outs.size(); ++o) n.outs[o]->storage = outs[o].storage();
    } else if (st.fused) {
      std::vector<Tensor> ins;
      for (const auto& [i, j] : st.ext_inputs) ins.push_back(resolved(nodes[i].inputs[j]));
      std::vector<Tensor> outs;
      for (const auto& [i, o] : st.outputs) {
        const TensorSpec& spec = nodes[i].specs[o];
        outs.push_back(Tensor::empty(spec.shape, spec.dtype, nodes[i].device));
      }
      st.fused->eval_cpu(ins, outs);
      for (size_t q = 0; q < outs.size(); ++q) {
        const auto& [i, o] = st.outputs[q];
        nodes[i].outs[o]->storage = outs[q].storage();
      }
    }
    for (const auto& [i, o] : st.release) nodes[i].outs[o]->storage.reset();
  }
}

void materialize_locked(State& s) {
  if (s.nodes.empty()) return;
  std::vector<Node> nodes = std::move(s.nodes);
  s.nodes.clear();
  const uint64_t seg = s.segment++;
  // Liveness: references to an output beyond the node itself and recorded inputs are user
  // handles, so the output must be kept (and allocated even if fused).
  std::unordered_map<const PendingOutput*, long> internal;
  for (const auto& n : nodes)
    for (const auto& t : n.inputs)
      if (t.impl()->pending && !t.impl()->storage) internal[t.impl()->pending.get()]++;
  std::vector<std::vector<char>> live(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    live[i].resize(n.outs.size());
    for (size_t o = 0; o < n.outs.size(); ++o) {
      const auto it = internal.find(n.outs[o].get());
      const long refs = n.outs[o].use_count() - 1 - (it == internal.end() ? 0 : it->second);
      live[i][o] = refs > 0;
    }
  }
  Hasher h;
  h.add(structural_hash(nodes, live));
  h.add(s.fuse);
  std::shared_ptr<const Plan> plan;
  SegmentReport rep;
  rep.nodes = int64_t(nodes.size());
  auto it = s.cache.find(h.value());
  if (it != s.cache.end()) {
    plan = it->second;
    rep.cache_hit = true;
    detail::note_cache_hit();
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    plan = plan_from_grouping(nodes, live, group_nodes(nodes, s.fuse));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    detail::note_compile(secs);
    s.cache.emplace(h.value(), plan);
  }
  for (const Step& st : plan->steps) rep.kernels += (st.node >= 0 || st.fused) ? 1 : 0;
  rep.fused_kernels = plan->fused_kernels;
  rep.fused_ops = plan->fused_ops;
  rep.allocations = plan->allocations;
  s.report = rep;
  detail::note_segment();
  detail::note_fused_kernels(plan->fused_kernels);
  cpu_stream().synchronize();  // inputs written by queued eager ops
  ++t_executing;
  try {
    run_plan(*plan, nodes);
  } catch (...) {
    --t_executing;
    throw;
  }
  --t_executing;
  (void)seg;
}

}  // namespace
}  // namespace graph_detail

using namespace graph_detail;

namespace graph_detail {
std::vector<Tensor> add_pending_outputs(Node& n, const std::vector<TensorSpec>& outputs,
                                        uint64_t segment, int64_t node, const Device& device) {
  std::vector<Tensor> result;
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
}  // namespace graph_detail

bool in_graph_execution() {
  return t_executing > 0;
}

namespace graph_detail {
ExecutionScope::ExecutionScope() {
  ++t_executing;
}
ExecutionScope::~ExecutionScope() {
  --t_executing;
}
}  // namespace graph_detail

std::vector<Tensor> record_op(PrimitivePtr p, const std::vector<Tensor>& inputs,
                              const std::vector<TensorSpec>& outputs, const Device& device) {
  if (tracing()) return trace_record(std::move(p), inputs, outputs, device);
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  Node n;
  n.device = device;
  n.specs = outputs;
  for (const auto& t : inputs) {
    const auto& impl = t.impl();
    if (!impl->storage && impl->pending) {
      const auto& po = impl->pending;
      if (po->storage) {
        impl->storage = po->storage;
      } else {
        TESSERA_CHECK(po->segment == s.segment && po->node >= 0, "[", p->name(),
                      "] input is a pending tensor whose deferred segment failed");
        n.inputs.push_back(Tensor(std::make_shared<TensorImpl>(*impl)));
        n.src_node.push_back(po->node);
        n.src_out.push_back(po->out);
        continue;
      }
    }
    n.inputs.push_back(t);
    n.src_node.push_back(-1);
    n.src_out.push_back(0);
  }
  std::vector<Tensor> result =
      graph_detail::add_pending_outputs(n, outputs, s.segment, int64_t(s.nodes.size()), device);
  const uint64_t oh = op_hash(*p, n.inputs);
  n.prim = std::move(p);
  s.nodes.push_back(std::move(n));
  if (s.repeat) {
    s.window.push_back(oh);
    if (s.window.size() > 256) s.window.pop_front();
  }
  if (int64_t(s.nodes.size()) >= s.node_limit ||
      (s.repeat && repeated_suffix(s, int64_t(s.nodes.size()))))
    materialize_locked(s);
  return result;
}

void materialize_pending_graph() {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  materialize_locked(s);
}

void resolve_pending(TensorImpl& impl) {
  if (impl.storage || !impl.pending) return;
  if (impl.pending->segment == kTraceSegment) trace_host_read(impl);
  if (!impl.pending->storage) materialize_pending_graph();
  TESSERA_CHECK(impl.pending->storage, "[defer] a pending tensor ", dtype_name(impl.dtype),
                shape_str(impl.shape), " has no data: its deferred segment failed");
  impl.storage = impl.pending->storage;
  impl.pending = nullptr;
}

SegmentReport last_segment_report() {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.report;
}

void set_defer_node_limit(int64_t n) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.node_limit = std::max<int64_t>(1, n);
}
void set_repeat_heuristic(bool on) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.repeat = on;
  s.window.clear();
  s.last_period = 0;
}
void set_fusion_enabled(bool on) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.fuse = on;
}
void clear_segment_cache() {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.cache.clear();
}

}  // namespace tessera
