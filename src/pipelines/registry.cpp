#include "pipelines/registry.h"

#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/flux2_transformer.h"
#include "models/flux_transformer.h"
#include "models/sd3_transformer.h"
#include "models/mistral3_text_model.h"
#include "models/t5_encoder.h"
#include "pipelines/flux2_pipeline.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/sd3_pipeline.h"
#include "runtime/error.h"

namespace tessera {
namespace {

Tensor get(const NamedTensors& in, const char* name) {
  auto it = in.find(name);
  return it == in.end() ? Tensor() : it->second;
}

void add_hidden_states(const std::vector<Tensor>& hs, NamedTensors* out) {
  for (size_t i = 0; i < hs.size(); ++i) (*out)["hidden_states." + std::to_string(i)] = hs[i];
}

std::vector<InputSpec> text_encoder_inputs(const std::string&) {
  return {{"input_ids", {2}, "(B, L) integer token ids", true},
          {"attention_mask", {2}, "(B, L), nonzero = attend", false}};
}

template <typename M>
NamedTensors run_clip(const std::string& folder, DType dtype, const NamedTensors& in,
                      const ComponentRunOptions& o) {
  const CLIPTextForwardOptions opt{.output_hidden_states = o.hidden_states,
                                   .attention_mask = get(in, "attention_mask")};
  const CLIPTextOutput r =
      M::from_pretrained(folder, dtype)->forward(get(in, "input_ids"), o.capture, opt);
  NamedTensors out;
  if (r.text_embeds.defined()) out["text_embeds"] = r.text_embeds;
  out["last_hidden_state"] = r.last_hidden_state;
  out["pooler_output"] = r.pooler_output;
  add_hidden_states(r.hidden_states, &out);
  return out;
}

NamedTensors run_t5(const std::string& folder, DType dtype, const NamedTensors& in,
                    const ComponentRunOptions& o) {
  const T5EncoderForwardOptions opt{.output_hidden_states = o.hidden_states,
                                    .attention_mask = get(in, "attention_mask")};
  const T5EncoderOutput r =
      T5EncoderModel::from_pretrained(folder, dtype)->forward(get(in, "input_ids"), o.capture, opt);
  NamedTensors out;
  out["last_hidden_state"] = r.last_hidden_state;
  add_hidden_states(r.hidden_states, &out);
  return out;
}

std::vector<InputSpec> flux_transformer_inputs(const std::string&) {
  return {{"hidden_states", {3}, "(B, L_img, in_channels)", true},
          {"encoder_hidden_states", {3}, "(B, L_txt, joint_attention_dim)", true},
          {"pooled_projections", {2}, "(B, pooled_projection_dim)", true},
          {"timestep", {1}, "(B,)", true},
          {"img_ids", {2, 3}, "(L_img, 3)", true},
          {"txt_ids", {2, 3}, "(L_txt, 3)", true},
          {"guidance", {1}, "(B,), FLUX.1-dev only", false}};
}

NamedTensors run_flux_transformer(const std::string& folder, DType dtype, const NamedTensors& in,
                                  const ComponentRunOptions& o) {
  const FluxTransformerInputs fi{get(in, "hidden_states"),
                                 get(in, "encoder_hidden_states"),
                                 get(in, "pooled_projections"),
                                 get(in, "timestep"),
                                 get(in, "img_ids"),
                                 get(in, "txt_ids"),
                                 get(in, "guidance")};
  NamedTensors out;
  out["sample"] = FluxTransformer2DModel::from_pretrained(folder, dtype)->forward(fi, o.capture);
  return out;
}

std::vector<InputSpec> sd3_transformer_inputs(const std::string&) {
  return {{"hidden_states", {4}, "(B, in_channels, H, W)", true},
          {"encoder_hidden_states", {3}, "(B, L_txt, joint_attention_dim)", true},
          {"pooled_projections", {2}, "(B, pooled_projection_dim)", true},
          {"timestep", {1}, "(B,), 0..1000", true}};
}

NamedTensors run_sd3_transformer(const std::string& folder, DType dtype, const NamedTensors& in,
                                 const ComponentRunOptions& o) {
  const SD3TransformerInputs si{get(in, "hidden_states"), get(in, "encoder_hidden_states"),
                                get(in, "pooled_projections"), get(in, "timestep"), {}};
  NamedTensors out;
  out["sample"] = SD3Transformer2DModel::from_pretrained(folder, dtype)->forward(si, o.capture);
  return out;
}

std::vector<InputSpec> vae_inputs(const std::string& method) {
  if (method == "decode") return {{"z", {4}, "(B, latent_channels, h, w)", true}};
  return {{"sample", {4}, "(B, in_channels, H, W)", true}};
}

NamedTensors run_vae(const std::string& folder, DType dtype, const NamedTensors& in,
                     const ComponentRunOptions& o) {
  const auto vae = AutoencoderKL::from_pretrained(folder, dtype);
  NamedTensors out;
  if (o.method == "decode") {
    out["sample"] = vae->decode(get(in, "z"), o.capture);
    return out;
  }
  // AutoencoderKLOutput.latent_dist, flattened as the goldens name its fields (mode() too).
  const DiagonalGaussianDistribution d = vae->encode(get(in, "sample"), o.capture);
  out["latent_dist.parameters"] = d.parameters;
  out["latent_dist.mean"] = d.mean;
  out["latent_dist.logvar"] = d.logvar;
  out["latent_dist.std"] = d.std;
  out["latent_dist.var"] = d.var;
  out["latent_dist.mode"] = d.mode();
  if (vae->config().is_flux2()) {
    // The BatchNorm statistics Flux2 pipelines normalise latents with, as the goldens keep.
    out["bn.running_mean"] = vae->bn_running_mean;
    out["bn.running_var"] = vae->bn_running_var;
  }
  return out;
}

std::unique_ptr<DiffusionPipeline> load_flux(PipelineFolder folder,
                                             const PipelineLoadOptions& options) {
  return FluxPipeline::from_folder(std::move(folder), options);
}

std::unique_ptr<DiffusionPipeline> load_sd3(PipelineFolder folder,
                                            const PipelineLoadOptions& options) {
  return StableDiffusion3Pipeline::from_folder(std::move(folder), options);
}

NamedTensors run_mistral3(const std::string& folder, DType dtype, const NamedTensors& in,
                          const ComponentRunOptions& o) {
  const Mistral3TextOutput r = Mistral3TextModel::from_pretrained(folder, dtype)
                                   ->forward(get(in, "input_ids"), get(in, "attention_mask"), -1,
                                             o.capture);
  NamedTensors out;
  out["last_hidden_state"] = r.hidden_states.back();
  if (o.hidden_states) add_hidden_states(r.hidden_states, &out);
  return out;
}

std::vector<InputSpec> flux2_transformer_inputs(const std::string&) {
  return {{"hidden_states", {3}, "(B, L_img, in_channels)", true},
          {"encoder_hidden_states", {3}, "(B, L_txt, joint_attention_dim)", true},
          {"timestep", {1}, "(B,)", true},
          {"img_ids", {2, 3}, "(L_img, 4)", true},
          {"txt_ids", {2, 3}, "(L_txt, 4)", true},
          {"guidance", {1}, "(B,)", false}};
}

NamedTensors run_flux2_transformer(const std::string& folder, DType dtype, const NamedTensors& in,
                                   const ComponentRunOptions& o) {
  const Flux2TransformerInputs fi{get(in, "hidden_states"), get(in, "encoder_hidden_states"),
                                  get(in, "timestep"),      get(in, "img_ids"),
                                  get(in, "txt_ids"),       get(in, "guidance")};
  NamedTensors out;
  out["sample"] = Flux2Transformer2DModel::from_pretrained(folder, dtype)->forward(fi, o.capture);
  return out;
}

std::unique_ptr<DiffusionPipeline> load_flux2(PipelineFolder folder,
                                              const PipelineLoadOptions& options) {
  return Flux2Pipeline::from_folder(std::move(folder), options);
}

// The entry of `classes` named `class_name`, or null.
template <typename Class>
const Class* find_class(const std::vector<Class>& classes, const std::string& class_name) {
  for (const auto& c : classes)
    if (c.class_name == class_name) return &c;
  return nullptr;
}

}  // namespace

const std::vector<ComponentClass>& component_classes() {
  static const std::vector<ComponentClass> classes = {
      {"CLIPTextModel", "text encoder", {}, text_encoder_inputs, run_clip<CLIPTextModel>},
      {"CLIPTextModelWithProjection",
       "text encoder",
       {},
       text_encoder_inputs,
       run_clip<CLIPTextModelWithProjection>},
      {"T5EncoderModel", "text encoder", {}, text_encoder_inputs, run_t5},
      {"FluxTransformer2DModel", "denoiser", {}, flux_transformer_inputs, run_flux_transformer},
      {"SD3Transformer2DModel", "denoiser", {}, sd3_transformer_inputs, run_sd3_transformer},
      {"AutoencoderKL", "VAE", {"decode", "encode"}, vae_inputs, run_vae},
      {"AutoencoderKLFlux2", "VAE", {"decode", "encode"}, vae_inputs, run_vae},
      {"Mistral3ForConditionalGeneration", "text encoder", {}, text_encoder_inputs, run_mistral3},
      {"Flux2Transformer2DModel", "denoiser", {}, flux2_transformer_inputs, run_flux2_transformer},
  };
  return classes;
}

const ComponentClass* find_component_class(const std::string& class_name) {
  return find_class(component_classes(), class_name);
}

std::string supported_component_classes() {
  std::string s;
  for (const auto& c : component_classes()) {
    s += (s.empty() ? "" : ", ") + c.class_name;
    if (!c.methods.empty()) {
      s += " (";
      for (size_t i = 0; i < c.methods.size(); ++i) s += (i ? ", ." : ".") + c.methods[i];
      s += ")";
    }
  }
  return s;
}

const std::vector<PipelineClass>& pipeline_classes() {
  static const std::vector<PipelineClass> classes = {
      {"FluxPipeline", "FLUX.1-schnell, FLUX.1-dev", load_flux},
      {"StableDiffusion3Pipeline", "SD3.5-medium, SD3.5-large", load_sd3},
      {"Flux2Pipeline", "FLUX.2-dev", load_flux2},
  };
  return classes;
}

const PipelineClass* find_pipeline_class(const std::string& class_name) {
  return find_class(pipeline_classes(), class_name);
}

std::string supported_pipeline_classes() {
  std::string s;
  for (const auto& p : pipeline_classes()) s += (s.empty() ? "" : ", ") + p.class_name;
  return s;
}

std::unique_ptr<DiffusionPipeline> DiffusionPipeline::from_pretrained(
    const std::string& path, const PipelineLoadOptions& options) {
  PipelineFolder folder = open_pipeline_folder(path);
  const PipelineClass* p = find_pipeline_class(folder.class_name);
  TESSERA_CHECK(p, path, ": pipeline class '", folder.class_name,
                "' is not supported yet (supported: ", supported_pipeline_classes(), ")");
  return p->load(std::move(folder), options);
}

}  // namespace tessera
