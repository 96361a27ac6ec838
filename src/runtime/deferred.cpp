// Deferred-and-fused mode's recorder (runtime/graph.h): ops recorded at dispatch() into the
// current segment, cut at sync points, the node limit or a repeated suffix; segments planned
// once per structural fingerprint, and guarded replay of the segment predicted to come next.
#include "runtime/graph.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "runtime/backend.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/fusion.h"
#include "runtime/executor.h"
#include "runtime/graph_plan.h"
#include "runtime/repeat_window.h"
#include "runtime/modes.h"

namespace tessera {
namespace graph_detail {
namespace {

// A planned segment, cached by fingerprint. It is also the template that guarded replay checks
// arriving ops against, and it holds its executable (argument lists and prepared kernels built
// once, so a run only binds storages: no TensorImpl per input, no Tensor per output).
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
  Executable exec;
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
  int64_t node_limit = *env::integer(EnvVar::defer_max_nodes);
  bool repeat = env::flag(EnvVar::defer_repeat_cut);
  bool fuse = !env::flag(EnvVar::defer_no_fuse);
  bool replay_enabled = !env::flag(EnvVar::defer_no_replay);
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

// Template metadata of a recorded input: its view, without storage or pending link.
Tensor meta_of(const Tensor& t) {
  auto m = std::make_shared<TensorImpl>(*t.impl());
  m->storage = nullptr;
  m->pending = nullptr;
  return Tensor(std::move(m));
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
  seg->exec.build(seg->nodes, *seg->plan, seg->value_base);
  seg->n_ext = seg->exec.num_ext();
  SegmentReport& rep = seg->report;
  rep.nodes = int64_t(nodes.size());
  for (const Step& st : seg->plan->steps) rep.kernels += (st.node >= 0 || st.fused) ? 1 : 0;
  rep.fused_kernels = seg->plan->fused_kernels;
  rep.fused_ops = seg->plan->fused_ops;
  rep.allocations = seg->plan->allocations;
  return seg;
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
  Executable& x = seg->exec;
  x.run({&b.prims, &b.ext, nullptr});
  for (size_t v = 0; v < b.outs.size(); ++v) b.outs[v]->storage = x.take(int64_t(v));
  x.clear_values();
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
