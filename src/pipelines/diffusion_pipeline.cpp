#include "pipelines/diffusion_pipeline.h"

#include "ops/linalg.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/primitive.h"

namespace tessera {

// What only loading needs: the load's memory meter and the recorder of every weight filled.
struct DiffusionPipeline::Loading {
  StageMemoryMeter meter;
  WeightRecorder recorder;
  bool release = false;  // offload requested: weights go as soon as loaded
};

DiffusionPipeline::DiffusionPipeline() = default;
DiffusionPipeline::~DiffusionPipeline() = default;

void DiffusionPipeline::begin_loading(PipelineFolder folder, const std::string& class_name,
                                      const PipelineLoadOptions& opt) {
  require_available(opt.device);
  TESSERA_CHECK(opt.dtype == DType::f32 || opt.dtype == DType::bf16, "[", class_name, "] dtype ",
                dtype_name(opt.dtype), " is not supported; use f32 or bf16");
  const std::string path = folder.path;
  folder_.emplace(std::move(folder));
  TESSERA_CHECK(folder_->class_name == class_name, path, ": model_index.json names '",
                folder_->class_name, "'; ", class_name, " expects a folder of that class");
  // One pass: every listed component, checked as PipelineFolder::component checks it.
  for (const auto& c : folder_->components) {
    if (c.library.empty() || !c.present) continue;
    components_[c.name] = &c;
  }
  path_ = path;
  class_name_ = class_name;
  dtype_ = opt.dtype;
  device_ = opt.device;
  tensor_parallel_ = opt.tensor_parallel;
  // One process per CPU rank (MPI), or one process driving an XLA device's mesh (SPMD).
  TESSERA_CHECK(!tensor_parallel_ ||
                    (tensor_parallel_->spmd() ? device_ == *tensor_parallel_->spmd_device
                                              : device_ == Device::cpu()),
                "[", class_name, "] tensor parallelism ",
                tensor_parallel_ && tensor_parallel_->spmd()
                    ? "over " + tensor_parallel_->spmd_device->str() + "'s devices"
                    : std::string("with one process per rank runs on CPU ranks"),
                "; got device ", device_.str());
  TESSERA_CHECK(!tensor_parallel_ || !tensor_parallel_->spmd() || opt.offload == OffloadMode::none,
                "[", class_name, "] SPMD tensor parallelism keeps every weight split over the "
                "devices; offload (which uploads weights whole per stage) does not combine with it");
  loading_ = std::make_unique<Loading>();
  loading_->release = opt.offload != OffloadMode::none;
}

const ComponentInfo& DiffusionPipeline::component(const std::string& name) const {
  auto it = components_.find(name);
  if (it != components_.end()) return *it->second;
  TESSERA_CHECK(folder_, "[", class_name_, "] no pipeline folder is open");
  return folder_->component(name);  // throws naming why (absent, [null, null], folder missing)
}

void DiffusionPipeline::adopt(Module& model, const std::string& name) {
  TESSERA_CHECK(loading_, "[", class_name_, "] load_model outside loading");
  // The recorder counts the model's reads as it takes its weights.
  const int64_t before = checkpoint_read_bytes();
  auto weights =
      std::make_unique<OffloadedModel>(model, loading_->recorder.take(model, loading_->release));
  models_.push_back({name, &model, std::move(weights), checkpoint_read_bytes() - before});
}

std::vector<DiffusionPipeline::ComponentLoad> DiffusionPipeline::component_loads() const {
  std::vector<ComponentLoad> out;
  for (const auto& m : models_) {
    bool sharded = false;
    for (const auto& p : m.model->named_parameters()) sharded |= p.shard.sharded();
    out.push_back({m.name, m.read_bytes, sharded});
  }
  return out;
}

void DiffusionPipeline::finish_loading(const PipelineLoadOptions& opt) {
  // Offload runs on the device asked for (else the detected one): weights move there per stage.
  std::optional<Device> onto = opt.offload_device;
  if (!onto && opt.device != Device::cpu()) onto = opt.device;
  if (opt.offload == OffloadMode::model) enable_model_cpu_offload(onto);
  if (opt.offload == OffloadMode::sequential) enable_sequential_cpu_offload(onto);
  // Without offload, every model lives on the pipeline's device (pipe.to(device)); under
  // offload each model's weights go there only while it runs (OffloadScope).
  if (opt.offload == OffloadMode::none && device_ != Device::cpu())
    for (auto& m : models_) m.model->to(device_);
  // Programs (TESSERA_COMPILE) run where the weights and inputs are.
  if (device_ != Device::cpu())
    for (auto& m : models_) m.model->set_compile_backend(backend_for(device_).name());
  load_memory_ = loading_->meter.finish();
  loading_.reset();
}

OffloadedModel* DiffusionPipeline::weights_of(const Module& model) const {
  for (const auto& m : models_)
    if (m.model == &model) return m.weights.get();
  return nullptr;
}

DiffusionPipeline::StageStart DiffusionPipeline::begin_stage() {
  StageStart s{StageMemoryMeter(), 0.0};
  s.t0 = now_seconds();  // after the meter's resets, which are not the stage's work
  return s;
}

void DiffusionPipeline::end_stage(Stage stage, const StageStart& start, PipelineOutput& out) {
  synchronize();
  const double seconds = now_seconds() - start.t0;
  switch (stage) {
    case Stage::encode:
      out.times.encode_seconds = seconds;
      out.memory.encode = start.meter.finish();
      break;
    case Stage::denoise:
      out.memory.denoise = start.meter.finish();
      break;
    case Stage::decode:
      out.times.decode_seconds = seconds;
      out.memory.decode = start.meter.finish();
      break;
  }
}

void DiffusionPipeline::denoising_loop(int steps, PipelineOutput& out,
                                       const StepCallback& on_step_end,
                                       const std::function<Tensor(int)>& step) {
  const OffloadScope scope = offload_scope(denoiser());
  for (int i = 0; i < steps; ++i) {
    const double t0 = now_seconds();
    const Tensor latents = step(i);
    synchronize();
    out.times.step_seconds.push_back(now_seconds() - t0);
    if (on_step_end) on_step_end(i, steps, latents);
  }
}

void DiffusionPipeline::release_all_weights() {
  for (auto& m : models_) m.weights->release();
}

void DiffusionPipeline::enable_model_cpu_offload(std::optional<Device> device) {
  TESSERA_CHECK(offload_ != OffloadMode::sequential, "[", class_name_,
                "] sequential CPU offload is already enabled; model offload cannot be enabled on "
                "top of it");
  device_ = resolve_offload_device(device);
  offload_ = OffloadMode::model;
  release_all_weights();
  for (auto& m : models_) m.weights->set_device(device_);
}

void DiffusionPipeline::enable_sequential_cpu_offload(std::optional<Device> device) {
  device_ = resolve_offload_device(device);
  for (auto& m : models_) m.weights->set_device(device_);
  if (offload_ == OffloadMode::sequential) return;
  offload_ = OffloadMode::sequential;
  release_all_weights();
  Module& d = denoiser();
  TESSERA_CHECK(weights_of(d), "[", class_name_, "] the denoiser was not loaded through load_model");
  // Every model that declares repeated blocks streams them (FLUX.2's text encoder layers too).
  for (auto& m : models_) {
    const std::vector<Module*> blocks = m.model->repeated_block_modules();
    if (!blocks.empty()) m.weights->stream_blocks(blocks);
  }
  // Repacked GEMM weights are keyed by storage; a zero-copy block would keep its packed copy
  // cached after release, so streamed weights bypass the cache (each block runs once a step).
  set_packed_weight_cache_capacity(0);
}

}  // namespace tessera
