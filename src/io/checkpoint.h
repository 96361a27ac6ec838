// Checkpoints as diffusers/transformers publish them: one .safetensors file, or shards listed by
// a *.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: shard file}}).
// Shards are opened (mmapped, header parsed) on first use; tensors are zero-copy views.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace tessera {

struct CheckpointSummary {
  size_t tensors = 0;
  uint64_t bytes = 0;
  std::map<DType, size_t> dtype_counts;  // tensors per dtype
  std::string dtypes_str() const;        // "bf16:776, f32:4"
};

class CheckpointReader {
 public:
  // `path`: a .safetensors file, a *.safetensors.index.json, or a folder holding one of them
  // (see find_checkpoint). Checks that every shard listed by an index exists.
  static CheckpointReader open(const std::string& path, const std::string& variant = "");

  const std::string& path() const;  // the file or index that was opened
  bool sharded() const;
  const std::vector<std::string>& names() const;  // sorted
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  Tensor get(const std::string& name) const;  // zero-copy where aligned
  std::string shard_path(const std::string& name) const;
  std::vector<std::string> shard_paths() const;  // sorted, unique
  // File metadata (single file) or the index's "metadata" object, values as JSON text for
  // non-strings.
  const std::map<std::string, std::string>& metadata() const;
  // Opens every shard and checks each weight_map entry is present there.
  void validate() const;
  CheckpointSummary summary() const;  // validates first

 private:
  struct State;
  std::shared_ptr<State> s_;
};

// The checkpoint file of a model folder: <stem>[.variant].safetensors.index.json or
// <stem>[.variant].safetensors for stem diffusion_pytorch_model then model, else the folder's
// only index or only .safetensors file. Returns "" when there is none; throws when ambiguous.
std::string find_checkpoint(const std::string& folder, const std::string& variant = "");

}  // namespace tessera
