// Model folders as the hub lays them out. A diffusers pipeline folder has model_index.json
// ({"_class_name": "FluxPipeline", "vae": ["diffusers", "AutoencoderKL"], ...}) and one
// subfolder per component; a component (or transformers model) folder has a config.json and
// weights; a tokenizer folder has its files; a scheduler folder has scheduler_config.json.
#pragma once
#include <string>
#include <vector>

#include "io/json_config.h"

namespace tessera {

enum class FolderKind { pipeline, model, tokenizer, scheduler, unknown };
const char* folder_kind_name(FolderKind k);

struct ComponentInfo {
  std::string name;        // "transformer"
  std::string library;     // "diffusers" / "transformers"; "" for a [null, null] entry
  std::string class_name;  // "FluxTransformer2DModel"
  std::string path;        // the component's folder
  bool present = false;    // the folder exists
  FolderKind kind = FolderKind::unknown;
  std::string config_path;   // config.json / scheduler_config.json / tokenizer_config.json or ""
  std::string weights_path;  // checkpoint file or index, "" when none
  std::vector<std::string> files;  // file names in the folder, sorted

  JsonConfig config() const;  // loads config_path; throws when there is none
};

struct PipelineFolder {
  std::string path;
  std::string class_name;                 // "_class_name"
  std::string diffusers_version;          // "_diffusers_version", may be ""
  JsonConfig index;                       // model_index.json
  std::vector<ComponentInfo> components;  // sorted by name

  bool has_component(const std::string& name) const;
  // Throws when model_index.json does not list `name` or its folder is missing.
  const ComponentInfo& component(const std::string& name) const;
};

// What a folder holds, judged by its files.
FolderKind detect_folder_kind(const std::string& path);

// Reads model_index.json (path may be the folder or the file itself).
PipelineFolder open_pipeline_folder(const std::string& path, const std::string& variant = "");

// Describes one folder: its config file, weights file and file list.
ComponentInfo open_component_folder(const std::string& path, const std::string& variant = "");

}  // namespace tessera
