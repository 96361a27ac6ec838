// A model's tensor-parallel plan (diffusers' _tp_plan, transformers' base_model_tp_plan): module
// path patterns ("transformer_blocks.*.attn.to_q", '*' one path component) mapped to how that
// Linear is split, and the config sizes that the degree must divide (heads). Applied before the
// weights load, so each rank reads only its slices (Module::load_weights).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "distributed/tensor_parallel.h"
#include "nn/module.h"

namespace tessera {

struct TensorParallelPlan {
  struct Entry {
    std::string pattern;
    ParallelStyle style;
    std::vector<int64_t> packed;  // fused blocks along the split features (packed styles)
  };
  std::vector<Entry> entries;
  // Config values the degree must divide, by config key ("num_attention_heads", 24): attention
  // heads stay whole on one rank.
  std::vector<std::pair<std::string, int64_t>> divisible;
};

// Splits every Linear (and Embedding table) of `model` that the plan names; the rest stays
// replicated. Errors (a size the degree does not divide, a match that is neither a Linear nor an
// Embedding) name `where`. A degree of 1 changes nothing.
void parallelize_module(Module& model, const TensorParallelPlan& plan,
                        const TensorParallelConfig& tp, const char* where);

// `path` matches `pattern` component by component ('*' matches any one component).
bool tp_pattern_matches(const std::string& pattern, const std::string& path);

}  // namespace tessera
