// DiffusionPipeline: what every pipeline shares, as diffusers' DiffusionPipeline does. The class
// comes from model_index.json's _class_name (pipelines/registry.h); a derived pipeline loads its
// components through load_model (each folder resolved once, weights recorded for offload) and
// says only what each stage computes: run_stage times, meters and synchronizes a stage,
// denoising_loop times each step and reports progress, offload_scope holds a model's weights.
// Offload (model / sequential) is applied here from the models' declared repeated blocks, never
// inside a model.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "io/model_folder.h"
#include "nn/pretrained.h"
#include "pipelines/offload.h"
#include "pipelines/pipeline_common.h"
#include "runtime/memory_stats.h"

namespace tessera {

// A text-to-image request in the terms every pipeline shares (generate builds one); unset
// values take the pipeline's defaults().
struct TextToImageOptions {
  std::vector<std::string> prompt;
  std::optional<std::vector<std::string>> prompt_2;
  // Pipelines with a third text encoder (SD3: T5) and with classifier-free guidance; the others
  // refuse them.
  std::optional<std::vector<std::string>> prompt_3, negative_prompt;
  std::optional<int64_t> height, width;
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  int num_images_per_prompt = 1;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_sequence_length;
  // FLUX.2 only: the text encoder's hidden-state layers stacked as the prompt embedding.
  std::optional<std::vector<int64_t>> text_encoder_out_layers;
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
  // streams the repeated blocks of every model that declares them (the denoiser's, a decoder
  // text encoder's layers) one at a time. `device`: the execution device
  // (default: detected); one that is not present is an error naming it and what is available.
  void enable_model_cpu_offload(std::optional<Device> device = std::nullopt);
  void enable_sequential_cpu_offload(std::optional<Device> device = std::nullopt);
  OffloadMode offload_mode() const { return offload_; }
  const Device& execution_device() const { return device_; }
  // Memory used by from_pretrained (peaks and checkpoint bytes read).
  const StageMemory& load_memory() const { return load_memory_; }
  // Per component, in load order: the checkpoint bytes its load read (offload: only what the
  // load converted; the rest is read as it runs) and whether tensor parallelism split it.
  struct ComponentLoad {
    std::string name;
    int64_t checkpoint_read_bytes = 0;
    bool sharded = false;
  };
  std::vector<ComponentLoad> component_loads() const;
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
  // model_index.json lists `name` with a class (not [null, null]); optional components
  // (SD3's text_encoder_3) are skipped when it does not.
  bool has_component(const std::string& name) const {
    return folder_ && folder_->has_component(name);
  }
  // Loads a model component and records its weights for offload (released at once under
  // offload, so loading holds one model at a time). Call in execution order.
  template <PretrainedModel M>
  std::unique_ptr<M> load_model(const std::string& name) {
    // SPMD splits only the transformer: it alone runs as a compiled program, and the text
    // encoders run op by op, which reads whole tensors (decision 0060).
    const bool split = tensor_parallel_ && (!tensor_parallel_->spmd() || name == "transformer");
    auto m = load_pretrained<M>(component(name).path, dtype_, split ? &*tensor_parallel_ : nullptr);
    adopt(*m, name);
    return m;
  }
  // Applies the requested offload and records the load's memory.
  void finish_loading(const PipelineLoadOptions& options);
  // The offload record of a loaded model, for OffloadScope (null when it was not loaded here).
  OffloadedModel* weights_of(const Module& model) const;
  // Holds `model`'s weights while the returned scope lives (no-op without offload):
  //   const OffloadScope scope = offload_scope(*vae);
  OffloadScope offload_scope(const Module& model) const { return {weights_of(model), offload_}; }

  // The stages of a call, as the report names them (out.times, out.memory).
  enum class Stage { encode, denoise, decode };
  // Runs one stage: resets the memory peaks, runs body, synchronizes (so queued work counts),
  // then records out.memory.<stage> and, for encode and decode, out.times.<stage>_seconds
  // (denoise is timed per step by denoising_loop). Returns what body returns.
  template <class F>
  auto run_stage(Stage stage, PipelineOutput& out, F&& body) {
    const StageStart start = begin_stage();
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      body();
      end_stage(stage, start, out);
    } else {
      auto result = body();
      end_stage(stage, start, out);
      return result;
    }
  }
  // The denoising loop, inside Stage::denoise: holds the denoiser's weights for all steps;
  // step(i) runs step i and returns the latents after it, which is then synchronized, timed into
  // out.times.step_seconds and passed to on_step_end.
  void denoising_loop(int steps, PipelineOutput& out, const StepCallback& on_step_end,
                      const std::function<Tensor(int)>& step);

  std::string path_, class_name_;
  DType dtype_ = DType::f32;
  OffloadMode offload_ = OffloadMode::none;
  Device device_;
  std::optional<TensorParallelConfig> tensor_parallel_;

 private:
  struct StageStart {
    StageMemoryMeter meter;
    double t0;
  };
  static StageStart begin_stage();
  static void end_stage(Stage stage, const StageStart& start, PipelineOutput& out);

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
    int64_t read_bytes;  // checkpoint bytes its load read
  };
  std::vector<Loaded> models_;  // in execution order
  StageMemory load_memory_;
};

}  // namespace tessera
