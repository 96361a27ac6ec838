#include "runtime/compile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "runtime/backend.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/modes.h"
#include "runtime/plan_cache.h"
#include "runtime/trace.h"

namespace tessera {

using namespace graph_detail;

namespace {

struct Settings {
  std::mutex mu;
  bool dir_read = false;
  std::string dir;
  bool fuse = !env::flag(EnvVar::defer_no_fuse);
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

// One traced function for one signature: recorded nodes, the plan, the memory plan, and the
// executable built from them at the first run.
class CompiledProgram {
 public:
  std::vector<Node> nodes;
  std::shared_ptr<const Plan> plan;
  std::vector<OutRef> outputs;
  std::vector<int64_t> value_base;  // flat index of each node's output 0
  MemoryPlan mem;
  Device device;  // where the slots live: the device of the program's ops
  bool eager_fallback = false;  // fullgraph=false and the trace broke: run the function eagerly

  std::vector<Tensor> run(const std::vector<Tensor>& inputs);

 private:
  std::mutex mu_;
  bool built_ = false;
  Executable exec_;
  std::vector<Tensor> bound_;                   // per run
  std::vector<std::shared_ptr<Storage>> ext_;  // per run: the inputs' storages
  std::vector<int64_t> ext_offset_;            // and offsets
};

namespace {

Tensor with_storage(const Tensor& meta, std::shared_ptr<Storage> storage, int64_t extra_offset) {
  auto impl = std::make_shared<TensorImpl>(*meta.impl());
  impl->storage = std::move(storage);
  impl->pending = nullptr;
  impl->offset += extra_offset;
  return Tensor(std::move(impl));
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
  std::vector<Tensor> outs;
  try {
    outs = trace_function(where, inputs, fn, &prog->nodes);
  } catch (const GraphBreak& e) {
    if (fullgraph) throw;
    std::fprintf(stderr, "%s; running this signature eagerly (fullgraph=false)\n", e.what());
    prog->eager_fallback = true;
    return prog;
  }
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
    if (load_plan(path, fingerprint, &grouping, &prog->mem)) {
      if (grouping_valid(grouping, nodes)) {
        prog->plan = plan_from_grouping(nodes, live, std::move(grouping));
        if (memory_plan_valid(nodes, *prog->plan, prog->value_base, live, prog->mem)) {
          detail::note_disk_cache_hit();
          return prog;
        }
      }
      std::fprintf(stderr,
                   "[compile] ignoring the plan cache file %s: it does not fit this graph\n",
                   path.c_str());
      prog->mem = MemoryPlan();
    }
  }
  prog->plan = plan_from_grouping(nodes, live, group_nodes(nodes, fuse));
  plan_memory(nodes, *prog->plan, prog->value_base, live, &prog->mem);
  if (!dir.empty()) store_plan(plan_path(dir, fingerprint), fingerprint, prog->plan->grouping, prog->mem);
  return prog;
}

}  // namespace

std::vector<Tensor> CompiledProgram::run(const std::vector<Tensor>& inputs) {
  std::lock_guard<std::mutex> lock(mu_);
  bound_.clear();
  for (const auto& t : inputs) {
    if (t.defined()) t.storage();  // materialises a deferred input
    bound_.push_back(t);
  }
  if (!built_) {
    exec_.build(nodes, *plan, value_base, mem.slot_of, mem.slot_bytes, device);
    built_ = true;
  }
  wait_all_streams();  // inputs written by queued eager ops
  ext_.assign(bound_.size(), nullptr);
  ext_offset_.assign(bound_.size(), 0);
  for (size_t k = 0; k < bound_.size(); ++k) {
    Tensor& t = bound_[k];
    if (!t.defined()) continue;
    if (!t.is_contiguous()) {  // placeholders are contiguous views
      Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
      backend_for(t.device()).copy(t, c);
      t = std::move(c);
    }
    ext_[k] = t.impl()->storage;
    ext_offset_[k] = t.offset();
  }
  exec_.run({nullptr, &ext_, &ext_offset_});
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
        result.push_back(with_storage(r.meta, exec_.value(exec_.value_index(r.node, r.out)), 0));
        break;
    }
  }
  exec_.clear_values();
  ext_.clear();
  bound_.clear();
  return result;
}

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
    s.dir = env::string(EnvVar::cache_dir);
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
