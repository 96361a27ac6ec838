#include "runtime/graph.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/fusion.h"
#include "runtime/graph_plan.h"
#include "runtime/modes.h"

namespace tessera {
namespace graph_detail {
namespace {

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

// The repeated-suffix heuristic, incrementally: run_[j] counts how many of the latest ops equal
// the op L = kMaxPeriod - j before them, so "the last L ops repeat the L before" is run >= L.
// Both arrays are walked forwards (period descending), so the per-op update vectorises; the
// window keeps 32 bits of each op hash (a collision only moves a cut, never changes results).
class RepeatWindow {
 public:
  static constexpr int32_t kMinPeriod = 3, kMaxPeriod = 128;
  void clear() {
    len_ = 0;
    any_ = false;
    std::fill(std::begin(run_), std::end(run_), 0);
  }
  void push(uint64_t h64) {
    const uint32_t h = uint32_t(h64 ^ (h64 >> 32));
    if (len_ == kCap) {  // keep the last kMaxPeriod hashes, the most any period looks back
      std::memmove(hist_, hist_ + kCap - kMaxPeriod, kMaxPeriod * sizeof(uint32_t));
      len_ = kMaxPeriod;
    }
    // Periods L <= len_ only: j from kMaxPeriod - min(len_, kMaxPeriod) to kMaxPeriod - 3.
    const int32_t j0 = kMaxPeriod - std::min<int32_t>(len_, kMaxPeriod);
    const int32_t back = len_ - kMaxPeriod;  // hist_[back + j] is the op L before
    int32_t best = 0;                        // max of run + j: >= kMaxPeriod when a period fits
    for (int32_t j = j0; j <= kMaxPeriod - kMinPeriod; ++j) {
      run_[j] = hist_[back + j] == h ? run_[j] + 1 : 0;
      best = std::max(best, run_[j] + j);
    }
    any_ = best >= kMaxPeriod;
    hist_[len_++] = h;
  }
  // Cut where the last L ops repeat the L before (3 <= L <= 128, L <= seg_len); the period
  // found last time is tried first, then the smallest.
  bool repeated_suffix(int64_t seg_len) {
    if (!any_) return false;
    if (last_period_ && last_period_ <= seg_len && run(last_period_) >= last_period_) return true;
    const int32_t top = int32_t(std::min<int64_t>(kMaxPeriod, seg_len));
    for (int32_t L = kMinPeriod; L <= top; ++L)
      if (run(L) >= L && L != last_period_) {
        last_period_ = L;
        return true;
      }
    return false;
  }
  void reset_period() { last_period_ = 0; }

 private:
  int32_t run(int32_t L) const { return run_[kMaxPeriod - L]; }
  static constexpr int32_t kCap = 4 * kMaxPeriod;
  uint32_t hist_[kCap] = {};
  int32_t len_ = 0;
  int32_t run_[kMaxPeriod + 1] = {};
  int32_t last_period_ = 0;
  bool any_ = false;
};

// A planned segment, cached by fingerprint. It is also the template that guarded replay checks
// arriving ops against, and it holds each step's argument lists, prepared once, so a run only
// binds storages (no TensorImpl per input, no Tensor per output).
struct Segment {
  uint64_t fingerprint = 0;
  bool fuse = true;
  std::shared_ptr<const Plan> plan;
  std::vector<Node> nodes;  // metadata only: inputs have neither storage nor pending links
  std::vector<const char*> names;
  std::vector<uint64_t> attr_hash, op_hash;
  std::vector<uint64_t> prefix;      // prefix[i]: structure of nodes 0..i (no liveness)
  std::vector<int64_t> value_base;   // flat index of each node's output 0; back() = all values
  std::vector<char> live;            // per flat value: held by the user after the segment
  std::vector<Strides> out_strides;  // per flat value: contiguous strides of its spec
  int64_t n_ext = 0;                 // inputs read from outside the segment
  SegmentReport report;
  std::weak_ptr<Segment> next;  // the segment that ran after this one last time

  struct Arg {
    int64_t value = -1;  // flat value, or
    int64_t ext = -1;    // external input index
  };
  struct Prepared {
    int64_t node = -1;  // single op: its primitive comes from the recorded op
    PrimitivePtr fused;
    std::vector<Tensor> ins, outs;
    std::vector<Arg> args;
    std::vector<int64_t> out_values;
    std::vector<size_t> out_bytes;
    std::vector<int64_t> release;  // flat values dropped after the step
    Backend* backend = nullptr;
    // The template op's kernel prepared for these views (Backend::prepare), or null. An
    // op replayed here has the template's name and attributes, so it computes the same function.
    std::unique_ptr<PreparedKernel> kernel;
  };
  std::vector<Prepared> steps;
};

// One segment's runtime arguments, in the template's order.
struct Bound {
  std::vector<PrimitivePtr> prims;                   // per node
  std::vector<std::shared_ptr<Storage>> ext;         // per external input
  std::vector<std::shared_ptr<PendingOutput>> outs;  // per flat value
};

struct State {
  std::recursive_mutex mu;
  std::vector<Node> nodes;          // normal recording
  std::vector<uint64_t> op_hashes;  // per recorded node
  uint64_t segment = 1;
  int64_t node_limit = env_int("TESSERA_DEFER_MAX_NODES", 4096);
  bool repeat = env_int("TESSERA_DEFER_REPEAT_CUT", 1) != 0;
  bool fuse = env_int("TESSERA_DEFER_NO_FUSE", 0) == 0;
  bool replay_enabled = env_int("TESSERA_DEFER_NO_REPLAY", 0) == 0;
  RepeatWindow window;
  std::unordered_map<uint64_t, std::shared_ptr<Segment>> cache;
  // Recent segments per first op (most recent last): alternatives when a prediction fails.
  std::unordered_map<const char*, std::vector<std::weak_ptr<Segment>>> by_first_op;
  std::shared_ptr<Segment> last;  // the segment run last (successor prediction)
  // Guarded replay of the current segment: ops matched so far against `replay`.
  std::shared_ptr<Segment> replay;
  int64_t pos = 0;
  Bound bound;
  bool replay_missed = false;  // this segment stopped matching: record it normally
  SegmentReport report;
};

State& state() {
  static State* s = new State();  // never destroyed: pending tensors may outlive main
  return *s;
}

thread_local int t_executing = 0;

uint64_t attributes_hash(const Primitive& p) {
  Hasher h;
  p.hash_attributes(h);
  return h.value();
}

uint64_t op_hash(const Primitive& p, uint64_t attrs, const std::vector<Tensor>& inputs) {
  Hasher h;
  for (const char* c = p.name(); *c; ++c) h.add(uint64_t(uint8_t(*c)));
  h.add(attrs);
  for (const auto& t : inputs) {
    h.add(uint64_t(t.dtype()));
    for (auto d : t.shape()) h.add(uint64_t(d));
  }
  return h.value();
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
    fusible[i] = fuse && fusion_supported(nodes[i].device) &&
                 is_fusible(*nodes[i].prim, nodes[i].inputs, nodes[i].specs, &rw);
    rowwise[i] = rw;
  }
  // Groups: several open at once, one per chain (FLUX's image and text streams interleave
  // chains of different shapes). A node joins an open group of its shape when it reads that
  // group's values only directly (or none); every other open group it reads from is closed
  // (emitted) first. Open groups never read each other (reading one closes it), and a node
  // emitted on its own reads no open group, so emitting a group where it closes keeps the order
  // a valid schedule.
  struct Open {
    std::vector<int64_t> members;
    Shape shape;
    int64_t id;
  };
  constexpr size_t kMaxOpen = 4;  // bounds planning work; the oldest closes first
  Grouping order;                 // emitted units: one node or one group
  std::vector<Open> open;
  int64_t next_id = 0;
  std::vector<char> dep, direct;
  auto close_at = [&](size_t g) {
    // Row-wise ops alone (q and k norms side by side) gain nothing from one kernel and would
    // lose their prepared kernels: they stay steps of their own.
    bool all_rowwise = true;
    for (int64_t m : open[g].members) all_rowwise = all_rowwise && rowwise[m];
    if (all_rowwise && open[g].members.size() > 1) {
      for (int64_t m : open[g].members) order.push_back({m});
    } else {
      order.push_back(std::move(open[g].members));
    }
    open.erase(open.begin() + int64_t(g));
  };
  for (int64_t i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    dep.assign(open.size(), 0);
    direct.assign(open.size(), 1);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const int64_t s = n.src_node[j];
      if (s < 0 || group_of[s] < 0) continue;
      for (size_t g = 0; g < open.size(); ++g) {
        if (open[g].id != group_of[s]) continue;
        dep[g] = 1;
        if (!is_direct(n.inputs[j], nodes[s].specs[n.src_out[j]])) direct[g] = 0;
      }
    }
    int64_t join = -1;
    if (fusible[i]) {
      for (int64_t g = int64_t(open.size()) - 1; g >= 0 && join < 0; --g)
        if (n.specs[0].shape == open[g].shape && (!dep[g] || (direct[g] && !rowwise[i]))) join = g;
    }
    for (int64_t g = int64_t(open.size()) - 1; g >= 0; --g) {
      if (!dep[g] || g == join) continue;
      close_at(size_t(g));
      if (g < join) --join;
    }
    if (join >= 0) {
      open[join].members.push_back(i);
      group_of[i] = open[join].id;
      continue;
    }
    if (fusible[i]) {
      if (open.size() >= kMaxOpen) close_at(0);
      open.push_back({{i}, n.specs[0].shape, next_id});
      group_of[i] = next_id++;
      continue;
    }
    order.push_back({i});
  }
  while (!open.empty()) close_at(0);
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

// Template metadata of a recorded input: its view, without storage or pending link.
Tensor meta_of(const Tensor& t) {
  auto m = std::make_shared<TensorImpl>(*t.impl());
  m->storage = nullptr;
  m->pending = nullptr;
  return Tensor(std::move(m));
}

void prepare_steps(Segment& seg) {
  const auto& nodes = seg.nodes;
  std::vector<std::vector<int64_t>> ext_of(nodes.size());
  int64_t next_ext = 0;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t j = 0; j < nodes[i].inputs.size(); ++j)
      ext_of[i].push_back(nodes[i].src_node[j] < 0 ? next_ext++ : -1);
  seg.n_ext = next_ext;
  auto add_input = [&](Segment::Prepared& p, int64_t i, int j) {
    const Node& n = nodes[i];
    Segment::Arg a;
    if (n.src_node[j] >= 0)
      a.value = seg.value_base[n.src_node[j]] + n.src_out[j];
    else
      a.ext = ext_of[i][j];
    p.ins.push_back(meta_of(n.inputs[j]));
    p.args.push_back(a);
  };
  auto add_output = [&](Segment::Prepared& p, int64_t i, int o) {
    const TensorSpec& spec = nodes[i].specs[o];
    auto impl = std::make_shared<TensorImpl>();
    impl->shape = spec.shape;
    impl->strides = contiguous_strides(spec.shape);
    impl->dtype = spec.dtype;
    impl->device = nodes[i].device;
    p.outs.emplace_back(std::move(impl));
    p.out_values.push_back(seg.value_base[i] + o);
    p.out_bytes.push_back(size_t(shape_numel(spec.shape)) * dtype_size(spec.dtype));
  };
  for (const Step& st : seg.plan->steps) {
    Segment::Prepared p;
    if (st.node >= 0) {
      p.node = st.node;
      p.backend = &backend_for(nodes[st.node].device);
      for (size_t j = 0; j < nodes[st.node].inputs.size(); ++j) add_input(p, st.node, int(j));
      for (size_t o = 0; o < nodes[st.node].specs.size(); ++o) add_output(p, st.node, int(o));
      p.kernel = p.backend->prepare(*nodes[st.node].prim, p.ins, p.outs);
    } else if (st.fused) {
      p.fused = st.fused;
      for (const auto& [i, j] : st.ext_inputs) add_input(p, i, j);
      for (const auto& [i, o] : st.outputs) add_output(p, i, o);
      if (!st.outputs.empty()) {
        p.backend = &backend_for(nodes[st.outputs.front().first].device);
        p.kernel = p.backend->prepare(*p.fused, p.ins, p.outs);
      }
    }
    for (const auto& [i, o] : st.release) p.release.push_back(seg.value_base[i] + o);
    seg.steps.push_back(std::move(p));
  }
}

std::shared_ptr<Segment> make_segment(std::vector<Node>& nodes, std::vector<uint64_t> op_hashes,
                                      const std::vector<std::vector<char>>& live,
                                      std::shared_ptr<const Plan> plan, uint64_t fingerprint,
                                      bool fuse) {
  auto seg = std::make_shared<Segment>();
  seg->fingerprint = fingerprint;
  seg->fuse = fuse;
  seg->plan = std::move(plan);
  seg->op_hash = std::move(op_hashes);
  int64_t v = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    Node t;
    t.prim = n.prim;
    t.src_node = n.src_node;
    t.src_out = n.src_out;
    t.specs = n.specs;
    t.device = n.device;
    for (const auto& in : n.inputs) t.inputs.push_back(meta_of(in));
    seg->names.push_back(n.prim->name());
    seg->attr_hash.push_back(attributes_hash(*n.prim));
    Hasher ph;
    ph.add(seg->prefix.empty() ? 0 : seg->prefix.back());
    ph.add_string(n.prim->name());
    ph.add(seg->attr_hash.back());
    ph.add(uint64_t(n.device.type));
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const Tensor& in = n.inputs[j];
      ph.add(uint64_t(n.src_node[j] + 1));
      ph.add(uint64_t(n.src_out[j]));
      ph.add(uint64_t(in.dtype()));
      ph.add(uint64_t(in.offset()));
      for (auto d : in.shape()) ph.add(uint64_t(d));
      for (auto d : in.strides()) ph.add(uint64_t(d));
    }
    for (const auto& spec : n.specs) {
      ph.add(uint64_t(spec.dtype));
      for (auto d : spec.shape) ph.add(uint64_t(d));
    }
    seg->prefix.push_back(ph.value());
    seg->value_base.push_back(v);
    for (size_t o = 0; o < n.specs.size(); ++o) {
      seg->live.push_back(live[i][o]);
      seg->out_strides.push_back(contiguous_strides(n.specs[o].shape));
    }
    v += int64_t(n.specs.size());
    seg->nodes.push_back(std::move(t));
  }
  seg->value_base.push_back(v);
  prepare_steps(*seg);
  SegmentReport& rep = seg->report;
  rep.nodes = int64_t(nodes.size());
  for (const Step& st : seg->plan->steps) rep.kernels += (st.node >= 0 || st.fused) ? 1 : 0;
  rep.fused_kernels = seg->plan->fused_kernels;
  rep.fused_ops = seg->plan->fused_ops;
  rep.allocations = seg->plan->allocations;
  return seg;
}

// Runs a prepared segment on recorded arguments: binds storages into the prepared argument
// lists, allocates each step's outputs and hands them to the pending outputs.
void run_segment(Segment& seg, Bound& b) {
  auto unbind = [&] {
    for (auto& p : seg.steps) {
      for (auto& t : p.ins) t.impl()->storage.reset();
      for (auto& t : p.outs) t.impl()->storage.reset();
    }
  };
  try {
    for (auto& p : seg.steps) {
      if (p.node >= 0 || p.fused) {
        for (size_t k = 0; k < p.args.size(); ++k) {
          const Segment::Arg& a = p.args[k];
          p.ins[k].impl()->storage = a.value >= 0 ? b.outs[a.value]->storage : b.ext[a.ext];
        }
        for (size_t q = 0; q < p.outs.size(); ++q)
          p.outs[q].impl()->storage = Storage::allocate(p.out_bytes[q], p.outs[q].device());
        if (p.kernel)
          p.kernel->run(p.ins, p.outs);
        else
          p.backend->run(p.fused ? *p.fused : *b.prims[p.node], p.ins, p.outs);
        for (size_t q = 0; q < p.outs.size(); ++q)
          b.outs[p.out_values[q]]->storage = std::move(p.outs[q].impl()->storage);
        for (auto& t : p.ins) t.impl()->storage.reset();
      }
      for (int64_t v : p.release) b.outs[v]->storage.reset();
    }
  } catch (...) {
    unbind();
    throw;
  }
}

// The recorded nodes as runtime arguments in template order.
Bound bind_nodes(std::vector<Node>& nodes) {
  Bound b;
  b.prims.reserve(nodes.size());
  for (auto& n : nodes) {
    b.prims.push_back(n.prim);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (n.src_node[j] >= 0) continue;
      const auto& st = n.inputs[j].impl()->storage;
      TESSERA_CHECK(st, "[", n.prim->name(), "] internal: recorded input has no storage");
      b.ext.push_back(st);
    }
    for (auto& po : n.outs) b.outs.push_back(po);
  }
  return b;
}

void note_ran(State& s, const std::shared_ptr<Segment>& seg, bool hit, bool replayed) {
  s.report = seg->report;
  s.report.cache_hit = hit;
  s.report.replayed = replayed;
  if (s.last) s.last->next = seg;
  s.last = seg;
  auto& list = s.by_first_op[seg->names.empty() ? nullptr : seg->names[0]];
  bool known = false;
  for (const auto& w : list) known = known || w.lock() == seg;
  if (!known) {
    if (list.size() >= 8) list.erase(list.begin());
    list.push_back(seg);
  }
  detail::note_segment(replayed);
  detail::note_fused_kernels(seg->plan->fused_kernels);
}

void execute(State& s, const std::shared_ptr<Segment>& seg, Bound& b, bool hit, bool replayed) {
  note_ran(s, seg, hit, replayed);
  wait_all_streams();  // inputs written by queued eager ops
  ++t_executing;
  try {
    run_segment(*seg, b);
  } catch (...) {
    --t_executing;
    throw;
  }
  --t_executing;
}

// The ops replayed so far become ordinary recorded nodes (a mismatch: record normally).
void replay_to_nodes(State& s) {
  if (!s.replay) return;
  const Segment& c = *s.replay;
  Bound& b = s.bound;
  int64_t e = 0;
  for (int64_t i = 0; i < s.pos; ++i) {
    const Node& t = c.nodes[i];
    Node n;
    n.prim = std::move(b.prims[i]);
    n.device = t.device;
    n.specs = t.specs;
    n.src_node = t.src_node;
    n.src_out = t.src_out;
    for (size_t j = 0; j < t.inputs.size(); ++j) {
      auto impl = std::make_shared<TensorImpl>(*t.inputs[j].impl());
      if (t.src_node[j] >= 0)
        impl->pending = b.outs[c.value_base[t.src_node[j]] + t.src_out[j]];
      else
        impl->storage = b.ext[e++];
      n.inputs.emplace_back(std::move(impl));
    }
    for (size_t o = 0; o < t.specs.size(); ++o) n.outs.push_back(b.outs[c.value_base[i] + o]);
    s.nodes.push_back(std::move(n));
    s.op_hashes.push_back(c.op_hash[i]);
  }
  s.replay.reset();
  s.pos = 0;
  s.bound = Bound();
}

void end_segment(State& s) {
  s.replay.reset();
  s.pos = 0;
  s.bound = Bound();
  s.replay_missed = false;
  s.nodes.clear();
  s.op_hashes.clear();
  ++s.segment;
}

// The prediction failed at op `pos` (or at the sync point): another recent segment with the same
// first `pos` ops (equal prefix fingerprints) for which `fits` holds takes over; the ops matched
// so far are bound the same way in both, so the recorded arguments stay valid.
template <typename Fits>
bool switch_replay(State& s, Fits&& fits) {
  const Segment& cur = *s.replay;
  auto it = s.by_first_op.find(cur.names[0]);
  if (it == s.by_first_op.end()) return false;
  for (size_t k = it->second.size(); k-- > 0;) {
    std::shared_ptr<Segment> c = it->second[k].lock();
    if (!c || c == s.replay || c->fuse != s.fuse || int64_t(c->nodes.size()) < s.pos) continue;
    if (s.pos > 0 && c->prefix[s.pos - 1] != cur.prefix[s.pos - 1]) continue;
    if (!fits(*c)) continue;
    s.replay = std::move(c);
    return true;
  }
  return false;
}

void materialize_locked(State& s) {
  if (s.replay) {
    // Liveness: a pending output referenced beyond our own handle is held by the user.
    auto fits = [&](const Segment& c) {
      if (s.pos != int64_t(c.nodes.size()) || c.fuse != s.fuse) return false;
      for (size_t v = 0; v < s.bound.outs.size(); ++v)
        if ((s.bound.outs[v].use_count() > 1) != bool(c.live[v])) return false;
      return true;
    };
    if (fits(*s.replay) || switch_replay(s, fits)) {
      const std::shared_ptr<Segment> seg = s.replay;
      Bound b = std::move(s.bound);
      end_segment(s);
      detail::note_cache_hit();
      execute(s, seg, b, true, true);
      return;
    }
    replay_to_nodes(s);
  }
  if (s.nodes.empty()) {
    s.replay_missed = false;
    return;
  }
  std::vector<Node> nodes = std::move(s.nodes);
  std::vector<uint64_t> op_hashes = std::move(s.op_hashes);
  end_segment(s);
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
  std::shared_ptr<Segment> seg;
  bool hit = false;
  auto it = s.cache.find(h.value());
  if (it != s.cache.end()) {
    seg = it->second;
    hit = true;
    detail::note_cache_hit();
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = plan_from_grouping(nodes, live, group_nodes(nodes, s.fuse));
    seg = make_segment(nodes, std::move(op_hashes), live, std::move(plan), h.value(), s.fuse);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    detail::note_compile(secs);
    s.cache.emplace(h.value(), seg);
  }
  Bound b = bind_nodes(nodes);
  nodes.clear();  // the recorded inputs' private impls: liveness no longer needs them
  execute(s, seg, b, hit, false);
}

// Guarded replay: does the arriving op equal op `pos` of the predicted segment (name,
// attributes, device, input views and edges, output specs)? Integer compares only.
bool replay_matches(const State& s, const Segment& c, const Primitive& p,
                    const std::vector<Tensor>& inputs, const std::vector<TensorSpec>& outputs,
                    const Device& device) {
  const int64_t i = s.pos;
  if (i >= int64_t(c.nodes.size())) return false;
  const Node& t = c.nodes[i];
  const char* name = p.name();
  if (name != c.names[i] && std::strcmp(name, c.names[i]) != 0) return false;
  if (inputs.size() != t.inputs.size() || outputs.size() != t.specs.size()) return false;
  if (device != t.device) return false;
  for (size_t o = 0; o < outputs.size(); ++o)
    if (outputs[o].dtype != t.specs[o].dtype || outputs[o].shape != t.specs[o].shape) return false;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const TensorImpl& a = *inputs[j].impl();
    const TensorImpl& m = *t.inputs[j].impl();
    if (a.dtype != m.dtype || a.offset != m.offset || a.shape != m.shape || a.strides != m.strides)
      return false;
    const PendingOutput* po = a.storage ? nullptr : a.pending.get();
    if (po && !po->storage) {
      if (po->segment != s.segment || po->node != t.src_node[j] || po->out != t.src_out[j])
        return false;
    } else if (t.src_node[j] >= 0 || (!a.storage && !po)) {
      return false;
    }
  }
  return attributes_hash(p) == c.attr_hash[i];
}

// Records a matched op: its primitive, its external storages, pending outputs.
std::vector<Tensor> replay_record(State& s, PrimitivePtr p, const std::vector<Tensor>& inputs,
                                  const Device& device) {
  const Segment& c = *s.replay;
  const int64_t i = s.pos++;
  const Node& t = c.nodes[i];
  Bound& b = s.bound;
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (t.src_node[j] >= 0) continue;
    TensorImpl& a = *inputs[j].impl();
    if (!a.storage) a.storage = a.pending->storage;  // a pending tensor of an earlier segment
    b.ext.push_back(a.storage);
  }
  b.prims.push_back(std::move(p));
  std::vector<Tensor> result;
  result.reserve(t.specs.size());
  for (size_t o = 0; o < t.specs.size(); ++o) {
    auto po = std::make_shared<PendingOutput>();
    po->segment = s.segment;
    po->node = i;
    po->out = int(o);
    auto impl = std::make_shared<TensorImpl>();
    impl->pending = po;
    impl->shape = t.specs[o].shape;
    impl->strides = c.out_strides[c.value_base[i] + o];
    impl->dtype = t.specs[o].dtype;
    impl->device = device;
    b.outs.push_back(std::move(po));
    result.emplace_back(std::move(impl));
  }
  return result;
}

// At the first op of a segment: the segment that followed the last one, else the latest
// segment that began with this op.
void predict(State& s, const Primitive& p) {
  std::shared_ptr<Segment> c = s.last ? s.last->next.lock() : nullptr;
  if (!c || c->names.empty() || std::strcmp(c->names[0], p.name()) != 0) {
    c.reset();
    auto it = s.by_first_op.find(p.name());
    if (it != s.by_first_op.end() && !it->second.empty()) c = it->second.back().lock();
  }
  if (c && c->fuse == s.fuse && !c->nodes.empty()) {
    s.replay = std::move(c);
    s.pos = 0;
    s.bound.prims.reserve(s.replay->nodes.size());
    s.bound.ext.reserve(size_t(s.replay->n_ext));
    s.bound.outs.reserve(size_t(s.replay->value_base.back()));
  }
}

}  // namespace
}  // namespace graph_detail

using namespace graph_detail;

namespace graph_detail {
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
  if (s.replay_enabled && !s.replay && !s.replay_missed && s.nodes.empty()) predict(s, *p);
  std::vector<Tensor> result;
  uint64_t oh = 0;
  bool replayed = false;
  if (s.replay) {
    if (replay_matches(s, *s.replay, *p, inputs, outputs, device) ||
        switch_replay(s, [&](const Segment& c) {
          return replay_matches(s, c, *p, inputs, outputs, device);
        })) {
      oh = s.replay->op_hash[s.pos];
      result = replay_record(s, std::move(p), inputs, device);
      replayed = true;
    } else {
      replay_to_nodes(s);
      s.replay_missed = true;
    }
  }
  if (!replayed) {
    Node n;
    n.device = device;
    n.specs = outputs;
    n.inputs.reserve(inputs.size());
    n.src_node.reserve(inputs.size());
    n.src_out.reserve(inputs.size());
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
    result =
        graph_detail::add_pending_outputs(n, outputs, s.segment, int64_t(s.nodes.size()), device);
    oh = op_hash(*p, attributes_hash(*p), n.inputs);
    n.prim = std::move(p);
    s.nodes.push_back(std::move(n));
    s.op_hashes.push_back(oh);
  }
  const int64_t seg_len = int64_t(s.nodes.size()) + s.pos;
  if (s.repeat) s.window.push(oh);
  if (seg_len >= s.node_limit || (s.repeat && s.window.repeated_suffix(seg_len)))
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
  s.window.reset_period();
}
void set_fusion_enabled(bool on) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.fuse = on;
}
void set_segment_replay(bool on) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.replay_enabled = on;
}
void clear_segment_cache() {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  replay_to_nodes(s);
  s.cache.clear();
  s.by_first_op.clear();
  s.last.reset();
}

}  // namespace tessera
