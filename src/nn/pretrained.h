// The one from_pretrained: a component folder's config.json -> the model built from it -> every
// parameter filled from the checkpoint's memory map, checked against the config, converted to
// the run dtype. Models supply only what differs (see PretrainedModel below); the process-wide
// switches that apply to a loaded model (TESSERA_COMPILE) are read here too, not in models.
//
// Per-rank sliced loading (tensor parallelism) belongs in load_checked: it is the one place a
// checkpoint tensor is read into a parameter slot.
#pragma once
#include <concepts>
#include <functional>
#include <memory>
#include <string>

#include "io/json_config.h"
#include "nn/checkpoint_source.h"
#include "nn/module.h"
#include "nn/tensor_parallel.h"

namespace tessera {

// What a model class provides to load_pretrained:
//   static constexpr const char* kPretrainedName  "[CLIPTextModel]", for errors
//   static Config config_from_json(const JsonConfig&)   and a constructor from that Config
//   void loaded(const WeightSource&, DType)       records the dtype, checks/ties what it needs
// and optionally:
//   static std::unique_ptr<WeightSource> weight_source(const CheckpointWeightSource&)
//       the checkpoint under the model's names (null: as is)
//   static bool ignored_tensor(const std::string&)  checkpoint tensors it may leave unused
//   TensorParallelPlan tp_plan() const   how a TensorParallelConfig splits it (nn/tensor_parallel.h);
//       a model without one loads whole on every rank
template <typename M>
concept PretrainedModel = requires(const JsonConfig& c, M& m, const WeightSource& s, DType d) {
  { M::kPretrainedName } -> std::convertible_to<const char*>;
  M(M::config_from_json(c));
  m.loaded(s, d);
};

// A component folder checked for loading: the dtype is f32 or bf16, the folder and its
// config.json exist. Errors start with `where`.
struct PretrainedFolder {
  std::string folder, config_path;
  JsonConfig config;
};
PretrainedFolder open_pretrained_folder(const std::string& folder, DType dtype, const char* where);

// load_weights in `dtype`, then refuses checkpoint tensors the config has no place for (the
// config does not describe these weights) unless `ignored` accepts them.
void load_checked(Module& model, const WeightSource& source, DType dtype,
                  const std::function<bool(const std::string&)>& ignored,
                  const std::string& config_path, const char* where);

// TESSERA_COMPILE=full|regional (the test suite runs the model tests compiled): applied to
// models that declare repeated blocks (the denoisers); others are left as they are.
void apply_environment(Module& model);

// `tp`: diffusers' from_pretrained(..., parallel_config=TensorParallelConfig(mesh)): the model is
// split by its plan before loading, so each rank reads only its slices of the checkpoint.
template <PretrainedModel M>
std::unique_ptr<M> load_pretrained(const std::string& folder, DType dtype,
                                   const TensorParallelConfig* tp = nullptr) {
  const PretrainedFolder f = open_pretrained_folder(folder, dtype, M::kPretrainedName);
  auto model = std::make_unique<M>(M::config_from_json(f.config));
  if constexpr (requires(const M& m) { m.tp_plan(); })
    if (tp) parallelize_module(*model, model->tp_plan(), *tp, M::kPretrainedName);
  const auto checkpoint = CheckpointWeightSource::open(folder);
  std::unique_ptr<WeightSource> renamed;
  if constexpr (requires { M::weight_source(checkpoint); }) renamed = M::weight_source(checkpoint);
  const WeightSource& source =
      renamed ? *renamed : static_cast<const WeightSource&>(checkpoint);
  std::function<bool(const std::string&)> ignored;
  if constexpr (requires(const std::string& n) { M::ignored_tensor(n); })
    ignored = [](const std::string& n) { return M::ignored_tensor(n); };
  load_checked(*model, source, dtype, ignored, f.config_path, M::kPretrainedName);
  model->loaded(source, dtype);
  apply_environment(*model);
  return model;
}

}  // namespace tessera
