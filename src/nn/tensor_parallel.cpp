#include "nn/tensor_parallel.h"

#include <sstream>

#include "nn/layers.h"
#include "runtime/error.h"

namespace tessera {

namespace {

std::vector<std::string> components(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string c; std::getline(ss, c, '.');) out.push_back(c);
  return out;
}

}  // namespace

bool tp_pattern_matches(const std::string& pattern, const std::string& path) {
  const auto p = components(pattern), q = components(path);
  if (p.size() != q.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != q[i]) return false;
  return true;
}

void parallelize_module(Module& model, const TensorParallelPlan& plan,
                        const TensorParallelConfig& tp, const char* where) {
  TESSERA_CHECK(tp.group || tp.spmd(), where,
                " tensor parallelism needs a process group or SPMD devices");
  const int n = tp.degree();
  for (const auto& [key, value] : plan.divisible)
    TESSERA_CHECK(value % n == 0, where, " ", key, "=", value,
                  " is not divisible by the tensor-parallel degree ", n,
                  "; choose a degree that divides it");
  if (n == 1) return;
  const auto modules = model.named_modules();
  for (const auto& e : plan.entries) {
    int matched = 0;
    for (const auto& [path, m] : modules) {
      if (!tp_pattern_matches(e.pattern, path)) continue;
      const std::string at = std::string(where) + " " + path;
      if (auto* linear = dynamic_cast<nn::Linear*>(m)) {
        linear->parallelize(e.style, tp, e.packed, at);
      } else if (auto* table = dynamic_cast<nn::Embedding*>(m); table && e.packed.empty()) {
        table->parallelize(e.style, tp, at);
      } else {
        TESSERA_FAIL(where, " tensor-parallel plan entry '", e.pattern, "' matches ", path, ", a ",
                     m->class_name(), "; only Linear and Embedding layers are split");
      }
      ++matched;
    }
    // Plans are written for the model's structure: an entry matching nothing is a stale plan
    // (models without some blocks, e.g. zero single layers, simply have no matches).
    (void)matched;
  }
}

}  // namespace tessera
