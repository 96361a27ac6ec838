#include "pipelines/denoiser_aot.h"

#include <map>

#include "io/model_folder.h"
#include "models/flux_transformer.h"
#include "models/sd3_transformer.h"
#include "nn/tensor_parallel.h"
#include "runtime/error.h"
#include "runtime/sharding.h"

namespace tessera {
namespace {

// Every required parameter as an uninitialised tensor of the config's shape on the device (an
// optional one stays undefined, as when a checkpoint lacks it).
// A parameter the TP plan splits (--tp) is a storage split over the devices (decision 0060).
void place_parameters(Module& m, DType dtype, const Device& device, DenoiserAotInfo* info) {
  for (const auto& p : m.named_parameters()) {
    if (p.optional) continue;
    *p.slot = p.split.sharded() ? empty_sharded(p.shape, dtype, device, p.split)
                                : Tensor::empty(p.shape, dtype, device);
    info->parameters += shape_numel(p.shape);
    info->parameter_bytes += int64_t(p.slot->nbytes());
    if (p.split.sharded()) info->split_parameter_bytes += int64_t(p.slot->nbytes());
  }
}

// --tp: the model's TP plan over o.tp devices of the target, as tessera generate --tp does.
template <typename M>
void split_by_plan(M& m, const DenoiserAotOptions& o, const char* name) {
  if (o.tp <= 1) return;
  const TensorParallelConfig tp = TensorParallelConfig::over_devices(o.device, o.tp, "[compile]");
  parallelize_module(m, m.tp_plan(), tp, name);
}

void compile_module(Module& m, const DenoiserAotOptions& o) {
  if (o.regional)
    m.compile_repeated_blocks(o.compile);
  else
    m.compile(o.compile);
}

std::string describe(const std::map<std::string, Tensor>& inputs) {
  std::string s;
  for (const auto& [name, t] : inputs) {
    if (!t.defined()) continue;
    s += (s.empty() ? "" : ", ") + name + " " + dtype_name(t.dtype()) + shape_str(t.shape());
  }
  return s;
}

// 2^(len(block_out_channels) - 1), as diffusers computes vae_scale_factor (8 without a VAE).
int64_t vae_scale_factor(const PipelineFolder& f) {
  if (!f.has_component("vae")) return 8;
  const ComponentInfo& vae = f.component("vae");
  if (vae.config_path.empty()) return 8;
  return int64_t(1) << (vae.config().get_int_list("block_out_channels").size() - 1);
}

DenoiserAotInfo trace_flux(const PipelineFolder& f, const DenoiserAotOptions& o) {
  DenoiserAotInfo info{f.class_name, "FluxTransformer2DModel", 0, 0, ""};
  const ComponentInfo& c = f.component("transformer");
  FluxTransformer2DModel m(FluxTransformerConfig::from_json(c.config()));
  m.loaded(MapWeightSource({}), o.dtype);
  split_by_plan(m, o, info.model.c_str());
  place_parameters(m, o.dtype, o.device, &info);
  compile_module(m, o);
  // FluxPipeline: latents packed 2x2 at 1/vae_scale of the image, one text id per T5 token.
  const int64_t multiple = vae_scale_factor(f) * 2;
  TESSERA_CHECK(o.height % multiple == 0 && o.width % multiple == 0, "[compile] ",
                f.class_name, " needs height and width divisible by ", multiple, ", got ",
                o.height, "x", o.width);
  const int64_t b = o.batch > 0 ? o.batch : 1;
  const int64_t tokens = (o.height / multiple) * (o.width / multiple);
  const int64_t text =
      o.max_sequence_length > 0 ? o.max_sequence_length : 512;
  FluxTransformerInputs in;
  in.hidden_states = Tensor::empty({b, tokens, m.config.in_channels}, o.dtype, o.device);
  in.encoder_hidden_states =
      Tensor::empty({b, text, m.config.joint_attention_dim}, o.dtype, o.device);
  in.pooled_projections = Tensor::empty({b, m.config.pooled_projection_dim}, o.dtype, o.device);
  in.timestep = Tensor::empty({b}, o.dtype, o.device);
  in.img_ids = Tensor::empty({tokens, 3}, o.dtype, o.device);
  in.txt_ids = Tensor::empty({text, 3}, o.dtype, o.device);
  if (m.config.guidance_embeds) in.guidance = Tensor::empty({b}, DType::f32, o.device);
  info.inputs = describe({{"hidden_states", in.hidden_states},
                          {"encoder_hidden_states", in.encoder_hidden_states},
                          {"pooled_projections", in.pooled_projections},
                          {"timestep", in.timestep},
                          {"img_ids", in.img_ids},
                          {"txt_ids", in.txt_ids},
                          {"guidance", in.guidance}});
  m.forward(in);
  return info;
}

DenoiserAotInfo trace_sd3(const PipelineFolder& f, const DenoiserAotOptions& o) {
  DenoiserAotInfo info{f.class_name, "SD3Transformer2DModel", 0, 0, ""};
  const ComponentInfo& c = f.component("transformer");
  SD3Transformer2DModel m(SD3TransformerConfig::from_json(c.config()));
  m.loaded(MapWeightSource({}), o.dtype);
  split_by_plan(m, o, info.model.c_str());
  place_parameters(m, o.dtype, o.device, &info);
  compile_module(m, o);
  // StableDiffusion3Pipeline: latents at 1/vae_scale, CLIP's 77 tokens then T5's, the
  // unconditional and conditional halves in one batch (guidance 7 by default).
  const int64_t scale = vae_scale_factor(f);
  const int64_t multiple = scale * m.config.patch_size;
  TESSERA_CHECK(o.height % multiple == 0 && o.width % multiple == 0, "[compile] ",
                f.class_name, " needs height and width divisible by ", multiple, ", got ",
                o.height, "x", o.width);
  const int64_t b = o.batch > 0 ? o.batch : 2;
  const int64_t text = 77 + (o.max_sequence_length > 0 ? o.max_sequence_length : 256);
  SD3TransformerInputs in;
  in.hidden_states =
      Tensor::empty({b, m.config.in_channels, o.height / scale, o.width / scale}, o.dtype, o.device);
  in.encoder_hidden_states =
      Tensor::empty({b, text, m.config.joint_attention_dim}, o.dtype, o.device);
  in.pooled_projections = Tensor::empty({b, m.config.pooled_projection_dim}, o.dtype, o.device);
  in.timestep = Tensor::empty({b}, DType::f32, o.device);
  info.inputs = describe({{"hidden_states", in.hidden_states},
                          {"encoder_hidden_states", in.encoder_hidden_states},
                          {"pooled_projections", in.pooled_projections},
                          {"timestep", in.timestep}});
  m.forward(in);
  return info;
}

}  // namespace

DenoiserAotInfo trace_denoiser(const std::string& folder, const DenoiserAotOptions& o) {
  const PipelineFolder f = open_pipeline_folder(folder);
  if (f.class_name == "FluxPipeline") return trace_flux(f, o);
  if (f.class_name == "StableDiffusion3Pipeline") return trace_sd3(f, o);
  TESSERA_FAIL("[compile] ", folder, ": ahead-of-time compilation knows FluxPipeline and "
               "StableDiffusion3Pipeline denoisers; model_index.json names ", f.class_name);
}

}  // namespace tessera
