#include "io/checkpoint.h"

#include <filesystem>
#include <mutex>
#include <set>

#include "io/json_config.h"
#include "runtime/error.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct CheckpointReader::State {
  std::string path;
  bool sharded = false;
  std::vector<std::string> names;
  std::map<std::string, std::string> shard_of;  // tensor -> shard path (sharded only)
  std::map<std::string, std::string> metadata;
  mutable std::mutex mu;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;

  std::shared_ptr<SafetensorsFile> shard(const std::string& file) const {
    std::lock_guard<std::mutex> lock(mu);
    auto& f = shards[file];
    if (!f) f = SafetensorsFile::open(file);
    return f;
  }
  std::shared_ptr<SafetensorsFile> file_for(const std::string& name) const {
    if (!sharded) return shard(path);
    auto it = shard_of.find(name);
    TESSERA_CHECK(it != shard_of.end(), path, ": no tensor named '", printable_name(name),
                  "' in weight_map");
    auto f = shard(it->second);
    TESSERA_CHECK(f->contains(name), path, ": weight_map maps '", printable_name(name),
                  "' to shard '", fs::path(it->second).filename().string(),
                  "', which has no tensor of that name");
    return f;
  }
};

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string find_checkpoint(const std::string& folder, const std::string& variant) {
  std::error_code ec;
  TESSERA_CHECK(fs::is_directory(folder, ec), folder, ": not a folder");
  const std::string v = variant.empty() ? "" : "." + variant;
  for (const char* stem : {"diffusion_pytorch_model", "model"}) {
    for (const std::string suffix : {".safetensors.index.json", ".safetensors"}) {
      const fs::path p = fs::path(folder) / (stem + v + suffix);
      if (fs::is_regular_file(p, ec)) return p.string();
    }
  }
  std::vector<std::string> indexes, files, bins;
  for (const auto& de : fs::directory_iterator(folder, ec)) {
    const std::string n = de.path().filename().string();
    if (ends_with(n, ".safetensors.index.json"))
      indexes.push_back(de.path().string());
    else if (ends_with(n, ".safetensors"))
      files.push_back(de.path().string());
    else if (ends_with(n, ".bin") || ends_with(n, ".pt") || ends_with(n, ".ckpt"))
      bins.push_back(n);
  }
  if (!variant.empty()) {
    TESSERA_CHECK(indexes.empty() && files.empty(), folder, ": no weights for variant '", variant,
                  "' (expected diffusion_pytorch_model.", variant, ".safetensors or model.",
                  variant, ".safetensors)");
  }
  if (indexes.size() == 1) return indexes[0];
  TESSERA_CHECK(indexes.empty(), folder, ": ", indexes.size(),
                " .safetensors.index.json files; cannot tell which is the model");
  if (files.size() == 1) return files[0];
  TESSERA_CHECK(files.empty(), folder, ": ", files.size(),
                " .safetensors files and no index; cannot tell which is the model");
  TESSERA_CHECK(bins.empty(), folder, ": only PyTorch pickle weights (", bins[0],
                "); tessera reads .safetensors");
  return "";
}

CheckpointReader CheckpointReader::open(const std::string& path, const std::string& variant) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file = find_checkpoint(path, variant);
    TESSERA_CHECK(!file.empty(), path, ": no weights (expected diffusion_pytorch_model",
                  "[.safetensors|.safetensors.index.json] or model[...])");
  }
  CheckpointReader r;
  r.s_ = std::make_shared<State>();
  State& s = *r.s_;
  s.path = file;
  if (!ends_with(file, ".json")) {
    auto f = s.shard(file);  // single file: parse now, errors surface at open
    for (const auto& e : f->entries()) s.names.push_back(e.name);
    s.metadata = f->metadata();
    return r;
  }
  s.sharded = true;
  const JsonConfig index = JsonConfig::load(file);
  TESSERA_CHECK(index.has("weight_map") && index.raw().at("weight_map").is_object(), file,
                ": no \"weight_map\" object (expected {tensor name: shard file})");
  if (index.has("metadata") && index.raw().at("metadata").is_object()) {
    for (const auto& [k, v] : index.raw().at("metadata").items())
      s.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  const fs::path dir = fs::path(file).parent_path();
  std::map<std::string, size_t> counts;
  for (const auto& [name, shard] : index.raw().at("weight_map").items()) {
    TESSERA_CHECK(shard.is_string(), file, ": weight_map entry for '", printable_name(name),
                  "' is a ", shard.type_name(), ", expected a shard file name");
    const fs::path rel(shard.get<std::string>());
    bool escapes = rel.empty() || rel.is_absolute();
    for (const auto& part : rel) escapes = escapes || part == "..";
    TESSERA_CHECK(!escapes, file, ": weight_map entry for '", printable_name(name),
                  "' names shard '", printable_name(rel.string()),
                  "' outside the checkpoint folder");
    s.shard_of[name] = (dir / rel).string();
    s.names.push_back(name);
    ++counts[(dir / rel).string()];
  }
  for (const auto& [shard, n] : counts) {
    TESSERA_CHECK(fs::is_regular_file(shard, ec), file, ": shard '",
                  fs::path(shard).filename().string(), "' (holding ", n,
                  n == 1 ? " tensor" : " tensors", ") is missing");
  }
  return r;
}

const std::string& CheckpointReader::path() const {
  return s_->path;
}
bool CheckpointReader::sharded() const {
  return s_->sharded;
}
const std::vector<std::string>& CheckpointReader::names() const {
  return s_->names;
}
const std::map<std::string, std::string>& CheckpointReader::metadata() const {
  return s_->metadata;
}

bool CheckpointReader::contains(const std::string& name) const {
  if (s_->sharded) return s_->shard_of.count(name) > 0;
  return s_->shard(s_->path)->contains(name);
}

const SafetensorsEntry& CheckpointReader::entry(const std::string& name) const {
  return s_->file_for(name)->entry(name);  // the file stays cached in State, so this lives on
}

Tensor CheckpointReader::get(const std::string& name) const {
  return s_->file_for(name)->get(name);
}

std::string CheckpointReader::shard_path(const std::string& name) const {
  if (!s_->sharded) return s_->path;
  auto it = s_->shard_of.find(name);
  TESSERA_CHECK(it != s_->shard_of.end(), s_->path, ": no tensor named '", printable_name(name),
                "' in weight_map");
  return it->second;
}

std::vector<std::string> CheckpointReader::shard_paths() const {
  if (!s_->sharded) return {s_->path};
  std::set<std::string> u;
  for (const auto& [n, p] : s_->shard_of) u.insert(p);
  return {u.begin(), u.end()};
}

void CheckpointReader::validate() const {
  for (const auto& name : s_->names) s_->file_for(name);
}

CheckpointSummary CheckpointReader::summary() const {
  CheckpointSummary sum;
  for (const auto& name : s_->names) {
    const SafetensorsEntry& e = entry(name);
    ++sum.tensors;
    sum.bytes += e.end - e.begin;
    ++sum.dtype_counts[e.dtype];
  }
  return sum;
}

std::string CheckpointSummary::dtypes_str() const {
  std::string out;
  for (const auto& [t, n] : dtype_counts) {
    if (!out.empty()) out += ", ";
    out += std::string(dtype_name(t)) + ":" + std::to_string(n);
  }
  return out;
}

}  // namespace tessera
