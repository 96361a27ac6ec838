#include "io/model_folder.h"

#include <algorithm>
#include <filesystem>

#include "io/checkpoint.h"
#include "runtime/error.h"

namespace tessera {

namespace fs = std::filesystem;

const char* folder_kind_name(FolderKind k) {
  switch (k) {
    case FolderKind::pipeline:
      return "pipeline";
    case FolderKind::model:
      return "model";
    case FolderKind::tokenizer:
      return "tokenizer";
    case FolderKind::scheduler:
      return "scheduler";
    case FolderKind::unknown:
      break;
  }
  return "unknown";
}

static bool has_file(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::is_regular_file(dir / name, ec);
}

static std::vector<std::string> list_files(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec))
    if (de.is_regular_file(ec)) out.push_back(de.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

FolderKind detect_folder_kind(const std::string& path) {
  const fs::path dir(path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return FolderKind::unknown;
  if (has_file(dir, "model_index.json")) return FolderKind::pipeline;
  if (has_file(dir, "scheduler_config.json")) return FolderKind::scheduler;
  if (has_file(dir, "config.json")) return FolderKind::model;
  for (const char* f :
       {"tokenizer_config.json", "tokenizer.json", "vocab.json", "spiece.model", "tokenizer.model"})
    if (has_file(dir, f)) return FolderKind::tokenizer;
  return FolderKind::unknown;
}

JsonConfig ComponentInfo::config() const {
  TESSERA_CHECK(!config_path.empty(), path, ": component '", name, "' has no config file");
  return JsonConfig::load(config_path);
}

ComponentInfo open_component_folder(const std::string& path, const std::string& variant) {
  ComponentInfo c;
  c.path = path;
  c.name = fs::path(path).filename().string();
  if (c.name.empty()) c.name = fs::path(path).parent_path().filename().string();
  std::error_code ec;
  c.present = fs::is_directory(path, ec);
  if (!c.present) return c;
  c.kind = detect_folder_kind(path);
  c.files = list_files(path);
  for (const char* f : {"config.json", "scheduler_config.json", "tokenizer_config.json",
                        "preprocessor_config.json"}) {
    if (has_file(path, f)) {
      c.config_path = (fs::path(path) / f).string();
      break;
    }
  }
  if (c.kind == FolderKind::model || c.kind == FolderKind::unknown)
    c.weights_path = find_checkpoint(path, variant);
  if (c.kind == FolderKind::unknown && !c.weights_path.empty()) c.kind = FolderKind::model;
  return c;
}

PipelineFolder open_pipeline_folder(const std::string& path, const std::string& variant) {
  std::error_code ec;
  fs::path dir(path);
  if (fs::is_regular_file(dir, ec) && dir.filename() == "model_index.json") dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  const fs::path index_path = dir / "model_index.json";
  TESSERA_CHECK(fs::is_regular_file(index_path, ec), dir.string(),
                ": no model_index.json (not a diffusers pipeline folder)");
  PipelineFolder p;
  p.path = dir.string();
  p.index = JsonConfig::load(index_path.string());
  p.class_name = p.index.get_string("_class_name");
  p.diffusers_version = p.index.get_string("_diffusers_version", "");
  for (const auto& [name, value] : p.index.raw().items()) {
    if (name.empty() || name[0] == '_' || !value.is_array()) continue;  // options, not parts
    TESSERA_CHECK(value.size() == 2 && (value[0].is_string() || value[0].is_null()) &&
                      (value[1].is_string() || value[1].is_null()),
                  index_path.string(), ": component '", name, "' is ", value.dump(),
                  ", expected [library, class]");
    ComponentInfo c;
    if (value[0].is_string() && value[1].is_string()) {
      TESSERA_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
                    index_path.string(), ": component name '", name, "' is not a folder name");
      c = open_component_folder((dir / name).string(), variant);
      c.library = value[0].get<std::string>();
      c.class_name = value[1].get<std::string>();
    }
    c.name = name;
    p.components.push_back(std::move(c));
  }
  std::sort(p.components.begin(), p.components.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return p;
}

bool PipelineFolder::has_component(const std::string& name) const {
  for (const auto& c : components)
    if (c.name == name && !c.library.empty()) return true;
  return false;
}

const ComponentInfo& PipelineFolder::component(const std::string& name) const {
  for (const auto& c : components) {
    if (c.name != name) continue;
    TESSERA_CHECK(!c.library.empty(), path, "/model_index.json: component '", name,
                  "' is [null, null] (not part of this pipeline)");
    TESSERA_CHECK(c.present, path, "/model_index.json lists component '", name, "' but folder ",
                  c.path, " is missing");
    return c;
  }
  TESSERA_FAIL(path, "/model_index.json: no component '", name, "'");
}

}  // namespace tessera
