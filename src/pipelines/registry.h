// The classes tessera runs, by the names model_index.json gives them: pipelines (for generate)
// and components (for run and inspect). The CLI looks classes up here instead of switching on
// their names; adding a model or pipeline adds an entry here.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipelines/diffusion_pipeline.h"

namespace tessera {

using NamedTensors = std::map<std::string, Tensor>;

// One forward() argument: its name, the ranks accepted and the layout shown in errors.
struct InputSpec {
  const char* name;
  std::vector<int64_t> ranks;
  const char* layout;
  bool required;
};

struct ComponentRunOptions {
  std::string method;          // "" for forward; "decode" / "encode" for VAEs
  bool hidden_states = false;  // text encoders: output_hidden_states
  NamedTensors* capture = nullptr;
};

struct ComponentClass {
  std::string class_name;             // "CLIPTextModel"
  std::string role;                   // "text encoder", "denoiser", "VAE"
  std::vector<std::string> methods;   // empty: forward; VAEs: decode, encode
  // The forward() arguments of `method`, named as diffusers / transformers name them.
  std::vector<InputSpec> (*inputs)(const std::string& method);
  // Loads the component folder in `dtype` and runs it; outputs named after the output class.
  NamedTensors (*run)(const std::string& folder, DType dtype, const NamedTensors& inputs,
                      const ComponentRunOptions& options);
};

struct PipelineClass {
  std::string class_name;  // "FluxPipeline"
  std::string models;      // what it runs, for help and errors
  std::unique_ptr<DiffusionPipeline> (*load)(PipelineFolder folder,
                                             const PipelineLoadOptions& options);
};

const std::vector<ComponentClass>& component_classes();
const ComponentClass* find_component_class(const std::string& class_name);
// "CLIPTextModel, ..., AutoencoderKL (.decode, .encode), ...", for errors.
std::string supported_component_classes();

const std::vector<PipelineClass>& pipeline_classes();
const PipelineClass* find_pipeline_class(const std::string& class_name);
std::string supported_pipeline_classes();

}  // namespace tessera
