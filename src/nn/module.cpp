#include "nn/module.h"

#include <set>

#include "ops/copy.h"
#include "runtime/error.h"

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
  params_.push_back({name, slot, std::move(shape), optional});
}

void Module::register_module(const std::string& name, Module* child) {
  children_.emplace_back(name, child);
}

std::vector<Module::Parameter> Module::named_parameters(const std::string& prefix) const {
  std::vector<Parameter> out;
  for (const auto& p : params_) out.push_back({prefix + p.name, p.slot, p.shape, p.optional});
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
                    shape_str(p.shape), ")");
      *p.slot = Tensor();
      continue;
    }
    Tensor t = source.get(key);
    TESSERA_CHECK(t.shape() == p.shape, source.describe(), ": tensor '", key, "' has shape ",
                  shape_str(t.shape()), " but the config implies ", shape_str(p.shape));
    TESSERA_CHECK(is_floating(t.dtype()), source.describe(), ": tensor '", key, "' has dtype ",
                  dtype_name(t.dtype()), "; expected a floating-point dtype");
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
