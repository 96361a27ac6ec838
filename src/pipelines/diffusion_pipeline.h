// DiffusionPipeline: what every pipeline shares, as diffusers' DiffusionPipeline does. The class
// comes from model_index.json's _class_name (pipelines/registry.h); a derived pipeline loads its
// components through load_model (each folder resolved once, weights recorded for offload) and
// runs its stages with the helpers below; offload (model / sequential) is applied here from the
// models' declared repeated blocks, never inside a model.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_folder.h"
#include "nn/pretrained.h"
#include "pipelines/offload.h"
#include "pipelines/pipeline_common.h"

namespace tessera {

// A text-to-image request in the terms every pipeline shares (generate builds one); unset
// values take the pipeline's defaults().
struct TextToImageOptions {
  std::vector<std::string> prompt;
  std::optional<std::vector<std::string>> prompt_2;
  std::optional<int64_t> height, width;
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  int num_images_per_prompt = 1;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_sequence_length;
  StepCallback on_step_end;  // progress
};

// The defaults of the diffusers pipeline's __call__ (what generate uses when a flag is absent).
struct PipelineDefaults {
  int num_inference_steps;
  double guidance_scale;
  int64_t max_sequence_length;
};

class DiffusionPipeline {
 public:
  virtual ~DiffusionPipeline();
  DiffusionPipeline(const DiffusionPipeline&) = delete;
  DiffusionPipeline& operator=(const DiffusionPipeline&) = delete;

  // The pipeline model_index.json names; a class tessera does not run is an error listing the
  // ones it does (defined in pipelines/registry.cpp).
  static std::unique_ptr<DiffusionPipeline> from_pretrained(
      const std::string& path, const PipelineLoadOptions& options = {});

  virtual PipelineOutput generate(const TextToImageOptions& options) = 0;
  virtual PipelineDefaults pipeline_defaults() const = 0;
  // The model the denoising loop calls each step (what compile options apply to).
  virtual Module& denoiser() = 0;

  // diffusers' offload API: each model holds its weights only while it runs; sequential also
  // streams the denoiser's repeated blocks one at a time. `device`: the execution device
  // (default: detected); one that is not present is an error naming it and what is available.
  void enable_model_cpu_offload(std::optional<Device> device = std::nullopt);
  void enable_sequential_cpu_offload(std::optional<Device> device = std::nullopt);
  OffloadMode offload_mode() const { return offload_; }
  const Device& execution_device() const { return device_; }
  // Memory used by from_pretrained (peaks and checkpoint bytes read).
  const StageMemory& load_memory() const { return load_memory_; }
  const std::string& class_name() const { return class_name_; }
  DType dtype() const { return dtype_; }
  const std::string& path() const { return path_; }

 protected:
  DiffusionPipeline();

  // Starts loading `folder` (model_index.json read once, by open_pipeline_folder): checks the
  // device and dtype, refuses a folder of another class, resolves every component once.
  void begin_loading(PipelineFolder folder, const std::string& class_name,
                     const PipelineLoadOptions& options);
  // A component listed in model_index.json with its folder present (resolved by begin_loading).
  const ComponentInfo& component(const std::string& name) const;
  // Loads a model component and records its weights for offload (released at once under
  // offload, so loading holds one model at a time). Call in execution order.
  template <PretrainedModel M>
  std::unique_ptr<M> load_model(const std::string& name) {
    auto m = load_pretrained<M>(component(name).path, dtype_);
    adopt(*m, name);
    return m;
  }
  // Applies the requested offload and records the load's memory.
  void finish_loading(const PipelineLoadOptions& options);
  // The offload record of a loaded model, for OffloadScope (null when it was not loaded here).
  OffloadedModel* weights_of(const Module& model) const;

  std::string path_, class_name_;
  DType dtype_ = DType::f32;
  OffloadMode offload_ = OffloadMode::none;
  Device device_;

 private:
  void adopt(Module& model, const std::string& name);
  void release_all_weights();

  std::optional<PipelineFolder> folder_;
  std::map<std::string, const ComponentInfo*> components_;
  struct Loading;
  std::unique_ptr<Loading> loading_;  // alive between begin_loading and finish_loading
  // The derived pipeline owns the models, so they are destroyed before these records: a record
  // never touches its model when destroyed (OffloadedModel), and `model` is only compared then.
  struct Loaded {
    std::string name;
    Module* model;
    std::unique_ptr<OffloadedModel> weights;
  };
  std::vector<Loaded> models_;  // in execution order
  StageMemory load_memory_;
};

}  // namespace tessera
