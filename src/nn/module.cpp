#include "nn/module.h"

#include <cxxabi.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <typeinfo>

#include "ops/copy.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/graph_plan.h"
#include "runtime/sharding.h"

namespace tessera {

namespace {
thread_local LoadObserver* g_load_observer = nullptr;
}  // namespace

LoadObserver* set_load_observer(LoadObserver* observer) {
  LoadObserver* prev = g_load_observer;
  g_load_observer = observer;
  return prev;
}

void Module::register_parameter(const std::string& name, Tensor* slot, Shape shape,
                                bool optional) {
  params_.push_back({name, slot, shape, optional, ShardSpec{}, shape, ShardSpec{}});
}

void Module::shard_parameter(const std::string& name, const ShardSpec& shard) {
  for (auto& p : params_) {
    if (p.name != name) continue;
    p.shard = shard;
    p.shape = shard.local_shape(p.full_shape);
    return;
  }
  TESSERA_FAIL("[tensor parallel] ", class_name(), " has no parameter '", name, "'");
}

void Module::split_parameter(const std::string& name, const ShardSpec& split) {
  for (auto& p : params_) {
    if (p.name != name) continue;
    p.split = split;
    p.split.index = 0;
    return;
  }
  TESSERA_FAIL("[tensor parallel] ", class_name(), " has no parameter '", name, "'");
}

void Module::split_parameter_for(const TensorParallelConfig& tp, const std::string& name,
                                 ShardSpec spec) {
  if (tp.spmd()) return split_parameter(name, spec);
  spec.index = tp.mesh.local_rank(*tp.group);
  shard_parameter(name, spec);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, child] : children_) {
    out.emplace_back(prefix + name, child);
    auto sub = child->named_modules(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

void Module::register_module(const std::string& name, Module* child) {
  children_.emplace_back(name, child);
}

std::vector<Module::Parameter> Module::named_parameters(const std::string& prefix) const {
  std::vector<Parameter> out;
  for (const auto& p : params_)
    out.push_back({prefix + p.name, p.slot, p.shape, p.optional, p.shard, p.full_shape, p.split});
  for (const auto& [name, child] : children_) {
    auto sub = child->named_parameters(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += shape_numel(p.shape);
  return n;
}

void Module::to(const Device& device) {
  const bool xla = device.type == DeviceType::xla || device.type == DeviceType::tpu;
  for (const Parameter& p : named_parameters()) {
    if (!p.slot->defined()) continue;
    if (xla && p.split.sharded()) {
      const Tensor& t = *p.slot;
      if (t.device() != device || !t.storage()->sharding)
        *p.slot = to_sharded(t, device, p.split);
      continue;
    }
    *p.slot = p.slot->to(device);
  }
  set_compile_backend(backend_for(device).name());
}

int64_t Module::parameter_bytes() const {
  int64_t n = 0;
  for (const auto& p : named_parameters())
    if (p.slot->defined()) n += int64_t(p.slot->nbytes());
  return n;
}

std::vector<std::string> Module::load_weights(const WeightSource& source, const LoadOptions& opt) {
  std::set<std::string> used;
  for (const auto& p : named_parameters()) {
    const std::string key = opt.prefix + p.name;
    if (!source.contains(key)) {
      TESSERA_CHECK(p.optional, source.describe(), ": missing tensor '", key, "' (expected shape ",
                    shape_str(p.full_shape), ")");
      *p.slot = Tensor();
      continue;
    }
    Tensor t = source.get(key);
    TESSERA_CHECK(t.shape() == p.full_shape, source.describe(), ": tensor '", key, "' has shape ",
                  shape_str(t.shape()), " but the config implies ", shape_str(p.full_shape));
    TESSERA_CHECK(is_floating(t.dtype()), source.describe(), ": tensor '", key, "' has dtype ",
                  dtype_name(t.dtype()), "; expected a floating-point dtype");
    // Tensor parallelism: only this rank's slice is read from the memory map.
    if (p.shard.sharded()) t = read_shard(t, p.shard);
    *p.slot = astype(t, opt.dtype);
    if (g_load_observer) g_load_observer->loaded(p.slot, t, opt.dtype);
    used.insert(key);
  }
  std::vector<std::string> unused;
  for (const auto& n : source.names())
    if (n.rfind(opt.prefix, 0) == 0 && !used.count(n)) unused.push_back(n);
  TESSERA_CHECK(opt.allow_unused || unused.empty(), source.describe(), ": unexpected tensor '",
                unused.empty() ? "" : unused.front(), "' (", unused.size(),
                " tensors not used by the model)");
  return unused;
}

void Module::release_weights() {
  for (const auto& p : named_parameters()) *p.slot = Tensor();
}

std::string Module::class_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && d ? d : mangled;
  std::free(d);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

void Module::compile(const CompileOptions& options) {
  compiled_ = std::make_shared<CompiledFunction>(class_name(), options, false);
}

void Module::compile_repeated_blocks(const CompileOptions& options) {
  validate_compile_options(options);
  const auto classes = repeated_blocks();
  TESSERA_CHECK(!classes.empty(), "[compile_repeated_blocks] ", class_name(),
                " lists no repeated blocks; use compile() for the whole model");
  std::map<std::string, std::shared_ptr<CompiledFunction>> per_class;
  for (const auto& c : classes) per_class[c] = std::make_shared<CompiledFunction>(c, options, true);
  std::map<std::string, int64_t> found;
  std::function<void(Module&)> walk = [&](Module& m) {
    for (auto& [name, child] : m.children_) {
      auto it = per_class.find(child->class_name());
      if (it == per_class.end()) {
        walk(*child);
        continue;
      }
      child->compiled_ = it->second;
      found[it->first]++;
    }
  };
  walk(*this);
  for (const auto& c : classes)
    TESSERA_CHECK(found.count(c), "[compile_repeated_blocks] ", class_name(),
                  " has no block of class ", c);
}

std::vector<Module*> Module::repeated_block_modules() {
  const auto classes = repeated_blocks();
  const std::set<std::string> wanted(classes.begin(), classes.end());
  std::vector<Module*> out;
  std::function<void(Module&)> walk = [&](Module& m) {
    for (auto& [name, child] : m.children_) {
      if (wanted.count(child->class_name()))
        out.push_back(child);
      else
        walk(*child);
    }
  };
  if (!wanted.empty()) walk(*this);
  return out;
}

void Module::set_compile_backend(const std::string& backend) {
  std::map<const CompiledFunction*, std::shared_ptr<CompiledFunction>> made;  // shared per class
  std::function<void(Module&)> walk = [&](Module& m) {
    if (m.compiled_ && m.compiled_->options().backend != backend) {
      auto& fresh = made[m.compiled_.get()];
      if (!fresh) {
        CompileOptions o = m.compiled_->options();
        o.backend = backend;
        validate_compile_options(o);
        fresh = std::make_shared<CompiledFunction>(m.compiled_->name(), o, m.compiled_->regional());
      }
      m.compiled_ = fresh;
    }
    for (auto& [name, child] : m.children_) walk(*child);
  };
  walk(*this);
}

void Module::reset_compile() {
  compiled_.reset();
  for (auto& [name, child] : children_) child->reset_compile();
}

std::map<std::string, int64_t> Module::compiled_programs() const {
  std::map<std::string, int64_t> out;
  std::set<const CompiledFunction*> seen;
  std::function<void(const Module&)> walk = [&](const Module& m) {
    if (m.compiled_ && seen.insert(m.compiled_.get()).second)
      out[m.compiled_->name()] += m.compiled_->num_programs();
    for (const auto& [name, child] : m.children_) walk(*child);
  };
  walk(*this);
  return out;
}

std::vector<Tensor> Module::call(const std::vector<Tensor>& inputs, const Body& body,
                                 int64_t variant) const {
  ForwardHook* h = hook_.get();
  if (!h) return run_program(inputs, body, variant);
  h->pre_forward(*this);
  auto out = run_program(inputs, body, variant);
  h->post_forward(*this);
  return out;
}

std::vector<Tensor> Module::run_program(const std::vector<Tensor>& inputs, const Body& body,
                                        int64_t variant) const {
  if (!compiled_ || graph_detail::tracing()) return body(inputs);
  if (!compiled_->regional()) return (*compiled_)(inputs, body, variant);
  // Regional: the parameters are inputs too; while tracing, the slots hold their placeholders.
  if (param_slots_.empty())
    for (const auto& p : named_parameters()) param_slots_.push_back(p.slot);
  const auto& params = param_slots_;
  std::vector<Tensor> all = inputs;
  all.reserve(inputs.size() + params.size());
  for (Tensor* slot : params) all.push_back(*slot);
  const size_t n = inputs.size();
  auto fn = [&](const std::vector<Tensor>& ph) {
    std::vector<Tensor> saved;
    for (size_t i = 0; i < params.size(); ++i) {
      saved.push_back(*params[i]);
      *params[i] = ph[n + i];
    }
    auto restore = [&] {
      for (size_t i = 0; i < params.size(); ++i) *params[i] = saved[i];
    };
    try {
      auto out = body(std::vector<Tensor>(ph.begin(), ph.begin() + int64_t(n)));
      restore();
      return out;
    } catch (...) {
      restore();
      throw;
    }
  };
  return (*compiled_)(all, fn, variant);
}

std::vector<std::string> RenamedWeightSource::names() const {
  std::vector<std::string> out;
  for (const auto& n : base_.names()) out.push_back(to_model_(n));
  return out;
}

Tensor MapWeightSource::get(const std::string& name) const {
  auto it = tensors_.find(name);
  TESSERA_CHECK(it != tensors_.end(), what_, ": missing tensor '", name, "'");
  return it->second;
}

std::vector<std::string> MapWeightSource::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

}  // namespace tessera
