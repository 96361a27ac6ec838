#include "runtime/compile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/atomic_file.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/fusion.h"
#include "runtime/graph_plan.h"
#include "runtime/modes.h"

namespace tessera {

using namespace graph_detail;

namespace {

constexpr int kPlanFormat = 2;  // bump when the plan file layout or planning rules change

// A host read of a traced tensor: fullgraph=false turns it into an eager fallback.
class GraphBreak : public Error {
 public:
  using Error::Error;
};

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

struct Settings {
  std::mutex mu;
  bool dir_read = false;
  std::string dir;
  bool fuse = std::getenv("TESSERA_DEFER_NO_FUSE") == nullptr;
};
Settings& settings() {
  static Settings* s = new Settings();
  return *s;
}

// Where a program output comes from.
struct OutRef {
  enum Kind { undefined, from_node, from_input, constant } kind = undefined;
  int64_t node = -1;
  int out = 0;
  int input_index = -1;
  Tensor meta;  // the traced view (node/input) or the constant itself
};

}  // namespace

// One traced function for one signature: recorded nodes, the plan, the memory plan.
class CompiledProgram {
 public:
  std::vector<Node> nodes;
  std::shared_ptr<const Plan> plan;
  std::vector<OutRef> outputs;
  std::vector<int64_t> value_base;  // flat index of each node's output 0
  std::vector<int> slot_of;         // per flat value: buffer slot, or -1 (fresh: an output)
  std::vector<size_t> slot_bytes;
  Device device;  // where the slots live: the device of the program's ops
  bool eager_fallback = false;  // fullgraph=false and the trace broke: run the function eagerly

  std::vector<Tensor> run(const std::vector<Tensor>& inputs);

 private:
  // Each step's argument lists, built once: a run only swaps storages in (no allocation but
  // the outputs that leave the program).
  struct Arg {
    int64_t value = -1;    // flat value read, or
    int placeholder = -1;  // program input read (offset: the traced view's)
    int64_t offset = 0;
  };
  struct Prepared {
    PrimitivePtr prim;
    std::vector<Tensor> ins, outs;
    std::vector<Arg> args;
    std::vector<int64_t> out_values;
    std::vector<TensorSpec> fresh_specs;  // per output: shape/dtype when allocated per run
    std::vector<char> fresh;
    Backend* backend = nullptr;
    Device device;
    std::unique_ptr<PreparedKernel> kernel;  // the backend's prepared kernel, or null: run()
  };
  void prepare();
  std::vector<Prepared> prepared_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Storage>> slots_;   // allocated at the first run, then reused
  std::vector<std::shared_ptr<Storage>> values_;  // per run
  std::vector<Tensor> bound_;                     // per run
};

namespace {

Tensor with_storage(const Tensor& meta, std::shared_ptr<Storage> storage, int64_t extra_offset) {
  auto impl = std::make_shared<TensorImpl>(*meta.impl());
  impl->storage = std::move(storage);
  impl->pending = nullptr;
  impl->offset += extra_offset;
  return Tensor(std::move(impl));
}

Tensor slot_tensor(const std::shared_ptr<Storage>& storage, const TensorSpec& spec,
                   const Device& device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->shape = spec.shape;
  impl->strides = contiguous_strides(spec.shape);
  impl->dtype = spec.dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

size_t spec_bytes(const TensorSpec& s, const Device& d) {
  return backend_for(d).allocator(d).block_size(size_t(shape_numel(s.shape)) * dtype_size(s.dtype));
}

// Values each step allocates, in order.
std::vector<std::pair<int64_t, int>> step_allocations(const Step& st, const std::vector<Node>& n) {
  if (st.node >= 0) {
    std::vector<std::pair<int64_t, int>> out;
    for (size_t o = 0; o < n[st.node].specs.size(); ++o) out.push_back({st.node, int(o)});
    return out;
  }
  return st.fused ? st.outputs : std::vector<std::pair<int64_t, int>>{};
}

// Static memory plan: each value that is not a program output gets a buffer slot, reused once
// its last reader ran (a value never shares a slot with an input of the step that writes it).
void plan_memory(CompiledProgram& p, const std::vector<std::vector<char>>& live) {
  std::multimap<size_t, int> free_slots;
  p.slot_of.assign(size_t(p.value_base.back()), -1);
  for (const Step& st : p.plan->steps) {
    for (const auto& [i, o] : step_allocations(st, p.nodes)) {
      if (live[i][o]) continue;
      const size_t bytes = spec_bytes(p.nodes[i].specs[o], p.nodes[i].device);
      auto it = free_slots.find(bytes);
      int slot;
      if (it != free_slots.end()) {
        slot = it->second;
        free_slots.erase(it);
      } else {
        slot = int(p.slot_bytes.size());
        p.slot_bytes.push_back(bytes);
      }
      p.slot_of[p.value_base[i] + o] = slot;
    }
    for (const auto& [i, o] : st.release) {
      const int slot = p.slot_of[p.value_base[i] + o];
      if (slot >= 0) free_slots.emplace(p.slot_bytes[slot], slot);
    }
  }
}

// Checks a memory plan read from disk: sizes fit, no slot holds two values alive at once.
bool memory_plan_valid(const CompiledProgram& p, const std::vector<std::vector<char>>& live) {
  if (p.slot_of.size() != size_t(p.value_base.back())) return false;
  std::vector<char> busy(p.slot_bytes.size(), 0);
  for (const Step& st : p.plan->steps) {
    for (const auto& [i, o] : step_allocations(st, p.nodes)) {
      const int slot = p.slot_of[p.value_base[i] + o];
      if (live[i][o]) {
        if (slot != -1) return false;
        continue;
      }
      if (slot < 0 || size_t(slot) >= busy.size() || busy[slot]) return false;
      if (p.slot_bytes[slot] < spec_bytes(p.nodes[i].specs[o], p.nodes[i].device)) return false;
      busy[slot] = 1;
    }
    for (const auto& [i, o] : st.release) {
      const int slot = p.slot_of[p.value_base[i] + o];
      if (slot >= 0) busy[slot] = 0;
    }
  }
  for (size_t v = 0; v < p.slot_of.size(); ++v)
    if (p.slot_of[v] >= int(p.slot_bytes.size())) return false;
  return true;
}

// A grouping read from disk must cover every node once, in dependency order, and fuse only
// nodes the fusion pass accepts, all of one shape.
bool grouping_valid(const Grouping& g, const std::vector<Node>& nodes) {
  std::vector<int64_t> unit(nodes.size(), -1);
  for (size_t u = 0; u < g.size(); ++u) {
    if (g[u].empty()) return false;
    for (int64_t i : g[u]) {
      if (i < 0 || size_t(i) >= nodes.size() || unit[i] >= 0) return false;
      unit[i] = int64_t(u);
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (unit[i] < 0) return false;
  for (size_t u = 0; u < g.size(); ++u) {
    for (size_t m = 0; m < g[u].size(); ++m) {
      const Node& n = nodes[g[u][m]];
      for (int64_t s : n.src_node) {
        if (s < 0) continue;
        if (unit[s] > int64_t(u)) return false;
        if (unit[s] == int64_t(u)) {  // in-group producers come earlier in the group
          bool earlier = false;
          for (size_t k = 0; k < m; ++k) earlier = earlier || g[u][k] == s;
          if (!earlier) return false;
        }
      }
      if (g[u].size() > 1) {
        bool rw = false;
        if (!is_fusible(*n.prim, n.inputs, n.specs, &rw)) return false;
        if (n.specs[0].shape != nodes[g[u][0]].specs[0].shape) return false;
      }
    }
  }
  return true;
}

uint64_t text_checksum(const std::string& s) {
  Hasher h;
  h.add_string(s);
  return h.value();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string plan_path(const std::string& dir, uint64_t fingerprint) {
  return (std::filesystem::path(dir) / ("plan-" + hex(fingerprint) + ".tplan")).string();
}

std::string plan_header(uint64_t fingerprint) {
  return "tessera-plan " + std::to_string(kPlanFormat) + " " + TESSERA_VERSION + " " +
         hex(fingerprint);
}

// Reads a plan file; false (after one warning line) when it is missing, stale or corrupt.
bool load_plan(const std::string& path, uint64_t fingerprint, Grouping* grouping,
               std::vector<int>* slot_of, std::vector<size_t>* slot_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream buf;
  buf << f.rdbuf();
  const std::string text = buf.str();
  auto warn = [&](const char* why) {
    std::fprintf(stderr, "[compile] ignoring the plan cache file %s: %s\n", path.c_str(), why);
    return false;
  };
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) return warn("truncated");
  if (text.substr(0, nl) != plan_header(fingerprint))
    return warn("written by another tessera version or plan format");
  const size_t last = text.rfind("checksum ");
  if (last == std::string::npos || last < nl) return warn("no checksum (truncated)");
  const std::string body = text.substr(nl + 1, last - nl - 1);
  if (text.substr(last) != "checksum " + hex(text_checksum(body)) + "\n")
    return warn("checksum mismatch (corrupt)");
  std::istringstream in(body);
  std::string word;
  int64_t n = 0;
  if (!(in >> word >> n) || word != "units" || n < 0) return warn("malformed units");
  grouping->assign(size_t(n), {});
  for (auto& unit : *grouping) {
    int64_t len = 0;
    if (!(in >> len) || len <= 0) return warn("malformed unit");
    unit.resize(size_t(len));
    for (auto& i : unit)
      if (!(in >> i)) return warn("malformed unit");
  }
  if (!(in >> word >> n) || word != "slots" || n < 0) return warn("malformed slots");
  slot_bytes->resize(size_t(n));
  for (auto& b : *slot_bytes)
    if (!(in >> b)) return warn("malformed slots");
  if (!(in >> word >> n) || word != "values" || n < 0) return warn("malformed values");
  slot_of->resize(size_t(n));
  for (auto& s : *slot_of)
    if (!(in >> s)) return warn("malformed values");
  return true;
}

void store_plan(const std::string& path, uint64_t fingerprint, const CompiledProgram& p) {
  std::ostringstream body;
  body << "units " << p.plan->grouping.size() << "\n";
  for (const auto& unit : p.plan->grouping) {
    body << unit.size();
    for (int64_t i : unit) body << " " << i;
    body << "\n";
  }
  body << "slots " << p.slot_bytes.size() << "\n";
  for (size_t b : p.slot_bytes) body << b << " ";
  body << "\nvalues " << p.slot_of.size() << "\n";
  for (int s : p.slot_of) body << s << " ";
  body << "\n";
  const std::string text = plan_header(fingerprint) + "\n" + body.str() + "checksum " +
                           hex(text_checksum(body.str())) + "\n";
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomically(path, [&](std::FILE* f) {
      return std::fwrite(text.data(), 1, text.size(), f) == text.size();
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[compile] could not write the plan cache file: %s\n", e.what());
  }
}

// The cache key: variant, then per input dtype, device, rank and dims (-1: undefined).
std::vector<int64_t> signature(const std::vector<Tensor>& inputs, int64_t variant) {
  std::vector<int64_t> key;
  key.reserve(inputs.size() * 6 + 1);
  key.push_back(variant);
  for (const auto& t : inputs) {
    if (!t.defined()) {
      key.push_back(-1);
      continue;
    }
    key.push_back(int64_t(t.dtype()));
    key.push_back(int64_t(t.device().type) * 1000 + t.device().index);
    key.push_back(t.ndim());
    key.insert(key.end(), t.shape().begin(), t.shape().end());
  }
  return key;
}

std::shared_ptr<CompiledProgram> trace_and_plan(const std::string& where,
                                                const std::vector<Tensor>& inputs,
                                                const CompiledFunction::Fn& fn, bool fullgraph) {
  auto prog = std::make_shared<CompiledProgram>();
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
  } catch (const GraphBreak& e) {
    if (fullgraph) throw;
    std::fprintf(stderr, "%s; running this signature eagerly (fullgraph=false)\n", e.what());
    prog->eager_fallback = true;
    return prog;
  }
  prog->nodes = std::move(trace.nodes);
  if (!prog->nodes.empty()) prog->device = prog->nodes.front().device;
  const auto& nodes = prog->nodes;
  prog->value_base.assign(nodes.size() + 1, 0);
  for (size_t i = 0; i < nodes.size(); ++i)
    prog->value_base[i + 1] = prog->value_base[i] + int64_t(nodes[i].specs.size());
  std::vector<std::vector<char>> live(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) live[i].assign(nodes[i].specs.size(), 0);
  for (const auto& t : outs) {
    OutRef r;
    if (t.defined()) {
      const auto& impl = t.impl();
      if (!impl->storage && impl->pending && impl->pending->segment == kTraceSegment) {
        const auto& po = *impl->pending;
        r.meta = t;
        if (po.node >= 0) {
          r.kind = OutRef::from_node;
          r.node = po.node;
          r.out = po.out;
          live[po.node][po.out] = 1;
        } else {
          r.kind = OutRef::from_input;
          r.input_index = int(-2 - po.node);
        }
      } else {
        r.kind = OutRef::constant;
        r.meta = t;
      }
    }
    prog->outputs.push_back(std::move(r));
  }
  placeholders.clear();
  outs.clear();

  Settings& st = settings();
  bool fuse;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    fuse = st.fuse;
  }
  const std::string dir = compile_cache_dir();
  Hasher h;
  h.add(structural_hash(nodes, live));
  h.add(fuse);
  const uint64_t fingerprint = h.value();
  if (!dir.empty()) {
    const std::string path = plan_path(dir, fingerprint);
    Grouping grouping;
    if (load_plan(path, fingerprint, &grouping, &prog->slot_of, &prog->slot_bytes)) {
      if (grouping_valid(grouping, nodes)) {
        prog->plan = plan_from_grouping(nodes, live, std::move(grouping));
        if (memory_plan_valid(*prog, live)) {
          detail::note_disk_cache_hit();
          return prog;
        }
      }
      std::fprintf(stderr,
                   "[compile] ignoring the plan cache file %s: it does not fit this graph\n",
                   path.c_str());
      prog->slot_of.clear();
      prog->slot_bytes.clear();
    }
  }
  prog->plan = plan_from_grouping(nodes, live, group_nodes(nodes, fuse));
  plan_memory(*prog, live);
  if (!dir.empty()) store_plan(plan_path(dir, fingerprint), fingerprint, *prog);
  return prog;
}

}  // namespace

void CompiledProgram::prepare() {
  for (size_t b : slot_bytes) slots_.push_back(Storage::allocate(b, device));
  for (const Step& st : plan->steps) {
    Prepared p;
    std::vector<std::pair<int64_t, int>> ins;
    if (st.node >= 0) {
      p.prim = nodes[st.node].prim;
      p.device = nodes[st.node].device;
      for (size_t j = 0; j < nodes[st.node].inputs.size(); ++j) ins.push_back({st.node, int(j)});
    } else if (st.fused) {
      p.prim = st.fused;
      p.device = nodes[st.outputs.front().first].device;
      ins = st.ext_inputs;
    }
    for (const auto& [i, j] : ins) {
      const Node& n = nodes[i];
      const Tensor& meta = n.inputs[j];
      Arg a;
      if (n.src_node[j] >= 0) {
        a.value = value_base[n.src_node[j]] + n.src_out[j];
      } else if (n.placeholder[j] >= 0) {
        a.placeholder = n.placeholder[j];
        a.offset = meta.offset();
      } else {
        p.ins.push_back(meta);  // a constant captured by the trace
        p.args.push_back(a);
        continue;
      }
      auto impl = std::make_shared<TensorImpl>(*meta.impl());
      impl->pending = nullptr;
      p.ins.emplace_back(std::move(impl));
      p.args.push_back(a);
    }
    for (const auto& [i, o] : step_allocations(st, nodes)) {
      const int64_t v = value_base[i] + o;
      const int slot = slot_of[v];
      p.out_values.push_back(v);
      p.fresh_specs.push_back(nodes[i].specs[o]);
      p.fresh.push_back(slot < 0);
      p.outs.push_back(slot < 0 ? Tensor()
                                : slot_tensor(slots_[slot], nodes[i].specs[o], nodes[i].device));
    }
    if (p.prim) {
      std::vector<Tensor> outs = p.outs;
      for (size_t q = 0; q < outs.size(); ++q)
        if (p.fresh[q]) outs[q] = slot_tensor(nullptr, p.fresh_specs[q], p.device);
      p.backend = &backend_for(p.device);
      p.kernel = p.backend->prepare(*p.prim, p.ins, outs);
    }
    prepared_.push_back(std::move(p));
  }
}

std::vector<Tensor> CompiledProgram::run(const std::vector<Tensor>& inputs) {
  std::lock_guard<std::mutex> lock(mu_);
  bound_.clear();
  for (const auto& t : inputs) {
    if (!t.defined()) {
      bound_.emplace_back();
      continue;
    }
    t.storage();  // materialises a deferred input
    bound_.push_back(t);
  }
  if (prepared_.size() != plan->steps.size()) prepare();
  values_.assign(size_t(value_base.back()), nullptr);
  wait_all_streams();  // inputs written by queued eager ops
  for (auto& t : bound_) {
    if (!t.defined() || t.is_contiguous()) continue;
    Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());  // placeholders are contiguous
    backend_for(t.device()).copy(t, c);
    t = std::move(c);
  }
  ExecutionScope scope;
  for (size_t s = 0; s < plan->steps.size(); ++s) {
    Prepared& p = prepared_[s];
    if (p.prim) {
      for (size_t k = 0; k < p.args.size(); ++k) {
        const Arg& a = p.args[k];
        if (a.value >= 0) {
          p.ins[k].impl()->storage = values_[a.value];
        } else if (a.placeholder >= 0) {
          const Tensor& b = bound_[a.placeholder];
          p.ins[k].impl()->storage = b.impl()->storage;
          p.ins[k].impl()->offset = a.offset + b.offset();
        }
      }
      for (size_t q = 0; q < p.outs.size(); ++q)
        if (p.fresh[q])
          p.outs[q] = Tensor::empty(p.fresh_specs[q].shape, p.fresh_specs[q].dtype, p.device);
      if (p.kernel)
        p.kernel->run(p.ins, p.outs);
      else
        p.backend->run(*p.prim, p.ins, p.outs);
      for (size_t q = 0; q < p.outs.size(); ++q) {
        values_[p.out_values[q]] = p.outs[q].impl()->storage;
        if (p.fresh[q]) p.outs[q] = Tensor();
      }
      for (size_t k = 0; k < p.args.size(); ++k)
        if (p.args[k].value >= 0 || p.args[k].placeholder >= 0) p.ins[k].impl()->storage.reset();
    }
    for (const auto& [i, o] : plan->steps[s].release) values_[value_base[i] + o].reset();
  }
  std::vector<Tensor> result;
  for (const auto& r : outputs) {
    switch (r.kind) {
      case OutRef::undefined:
        result.emplace_back();
        break;
      case OutRef::constant:
        result.push_back(r.meta);
        break;
      case OutRef::from_input: {
        const Tensor& b = bound_[r.input_index];
        result.push_back(with_storage(r.meta, b.impl()->storage, b.offset()));
        break;
      }
      case OutRef::from_node:
        result.push_back(with_storage(r.meta, values_[value_base[r.node] + r.out], 0));
        break;
    }
  }
  values_.clear();
  bound_.clear();
  return result;
}

namespace graph_detail {

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

}  // namespace graph_detail

void validate_compile_options(const CompileOptions& o) {
  TESSERA_CHECK(!o.dynamic,
                "[compile] dynamic=true is not supported: static shapes only (as on TPU); each new "
                "input shape compiles once");
  std::string built;
  for (Backend* b : backends()) {
    if (o.backend == b->name()) return;
    built += std::string(built.empty() ? "" : ", ") + "\"" + b->name() + "\"";
  }
  TESSERA_FAIL("[compile] backend '", o.backend, "' is not built; this build compiles for backend ",
               built);
}

CompiledFunction::CompiledFunction(std::string name, CompileOptions options, bool regional)
    : name_(std::move(name)), options_(std::move(options)), regional_(regional) {
  validate_compile_options(options_);
}

CompiledFunction::~CompiledFunction() = default;

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& inputs, const Fn& fn,
                                                 int64_t variant) {
  if (tracing()) return fn(inputs);  // part of an enclosing program
  for (const auto& t : inputs)
    TESSERA_CHECK(!t.defined() || backend_for(t.device()).name() == options_.backend,
                  "[compile] ", name_, ": input on ", t.device().str(), "; backend \"",
                  options_.backend, "\" needs ", options_.backend, " tensors");
  materialize_pending_graph();  // deferred work recorded before the call
  const std::vector<int64_t> key = signature(inputs, variant);
  std::shared_ptr<CompiledProgram> prog;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = programs_.find(key);
    if (it != programs_.end()) {
      prog = it->second;
      ++cache_hits_;
      detail::note_cache_hit();
      detail::note_program_cache_hit();
    }
  }
  if (!prog) {
    const auto t0 = std::chrono::steady_clock::now();
    prog = trace_and_plan(name_, inputs, fn, options_.fullgraph);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    detail::note_compile(secs);
    detail::note_program_built();
    std::lock_guard<std::mutex> lock(mu_);
    programs_[key] = prog;
    ++compiles_;
  }
  if (prog->eager_fallback) return fn(inputs);
  detail::note_compiled_run(regional_, prog->plan->fused_kernels);
  return prog->run(inputs);
}

int64_t CompiledFunction::num_programs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(programs_.size());
}
int64_t CompiledFunction::compiles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiles_;
}
int64_t CompiledFunction::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_hits_;
}
void CompiledFunction::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  programs_.clear();
}

void set_compile_cache_dir(const std::string& dir) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  s.dir = dir;
  s.dir_read = true;
}

std::string compile_cache_dir() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.dir_read) {
    const char* v = std::getenv("TESSERA_CACHE_DIR");
    s.dir = v ? v : "";
    s.dir_read = true;
  }
  return s.dir;
}

void set_compile_fusion_enabled(bool on) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  s.fuse = on;
}

}  // namespace tessera
