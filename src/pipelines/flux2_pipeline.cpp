#include "pipelines/flux2_pipeline.h"

#include <cstdio>
#include <random>

#include "io/model_folder.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace tessera {
namespace {

constexpr const char* kWhere = "[Flux2Pipeline]";
constexpr int64_t kDefaultSampleSize = 128;  // Flux2Pipeline.default_sample_size

}  // namespace

// The text of diffusers' pipelines/flux2/system_messages.py SYSTEM_MESSAGE (it is part of the
// prompt the text encoder sees, so it must be the same bytes).
const char* const Flux2Pipeline::kSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing "
    "on object relationships, object\nattribution and actions without speculation.";

std::unique_ptr<Flux2Pipeline> Flux2Pipeline::from_pretrained(const std::string& path,
                                                              const PipelineLoadOptions& opt) {
  return from_folder(open_pipeline_folder(path), opt);
}

std::unique_ptr<Flux2Pipeline> Flux2Pipeline::from_folder(PipelineFolder folder,
                                                          const PipelineLoadOptions& opt) {
  const std::string path = folder.path;
  auto p = std::make_unique<Flux2Pipeline>();
  p->begin_loading(std::move(folder), "Flux2Pipeline", opt);
  p->tokenizer =
      std::make_unique<tokenizers::BpeTokenizer>(tokenizers::BpeTokenizer::from_tokenizer_json(
          p->component("tokenizer").path + "/tokenizer.json"));
  p->text_encoder = p->load_model<Mistral3TextModel>("text_encoder");
  p->transformer = p->load_model<Flux2Transformer2DModel>("transformer");
  p->vae = p->load_model<AutoencoderKL>("vae");
  TESSERA_CHECK(p->vae->config().is_flux2(), path, ": the vae is ", p->vae->config().class_name,
                "; Flux2Pipeline needs AutoencoderKLFlux2 (its BatchNorm statistics)");
  const ComponentInfo& sched = p->component("scheduler");
  TESSERA_CHECK(sched.class_name == "FlowMatchEulerDiscreteScheduler", path, ": scheduler class '",
                sched.class_name, "' is not supported; expected FlowMatchEulerDiscreteScheduler");
  p->scheduler = std::make_unique<FlowMatchEulerDiscreteScheduler>(
      FlowMatchEulerDiscreteConfig::from_json_file(sched.config_path));
  p->vae_scale_factor_ = p->vae->scale_factor();
  p->finish_loading(opt);
  return p;
}

PipelineOutput Flux2Pipeline::generate(const TextToImageOptions& o) {
  TESSERA_CHECK(!o.prompt_2, kWhere, " takes one prompt (there is no prompt_2)");
  Flux2CallOptions call;
  call.prompt = o.prompt;
  call.height = o.height;
  call.width = o.width;
  call.num_inference_steps = o.num_inference_steps;
  call.guidance_scale = o.guidance_scale;
  call.num_images_per_prompt = o.num_images_per_prompt;
  call.seed = o.seed;
  call.max_sequence_length =
      o.max_sequence_length.value_or(pipeline_defaults().max_sequence_length);
  if (o.text_encoder_out_layers) call.text_encoder_out_layers = *o.text_encoder_out_layers;
  call.on_step_end = o.on_step_end;
  return (*this)(call);
}

Flux2Pipeline::PromptEmbeds Flux2Pipeline::encode_prompt(const std::vector<std::string>& prompt,
                                                         int n, int64_t max_sequence_length,
                                                         const std::vector<int64_t>& layers) {
  std::vector<tokenizers::Encoding> ids;
  for (const auto& s : prompt) {
    ids.push_back(tokenizer->encode_flux2_chat(s, kSystemMessage, max_sequence_length));
    if (ids.back().num_truncated > 0)
      std::fprintf(stderr,
                   "tessera: warning: the chat prompt was truncated to max_sequence_length=%lld "
                   "tokens (%lld tokens removed)\n",
                   (long long)max_sequence_length, (long long)ids.back().num_truncated);
  }
  PromptEmbeds e;
  std::tie(e.input_ids, e.attention_mask) = tokenizers::to_tensors(ids);
  Tensor embeds;
  {
    const OffloadScope scope = offload_scope(*text_encoder);
    embeds = text_encoder->prompt_embeds(e.input_ids.to(device_), e.attention_mask.to(device_),
                                          layers);
  }
  e.prompt_embeds = repeat_rows(astype(embeds, dtype_), n);
  const int64_t L = e.prompt_embeds.dim(1);
  std::vector<int64_t> t(size_t(L * 4), 0);
  for (int64_t l = 0; l < L; ++l) t[size_t(l * 4 + 3)] = l;
  e.text_ids = Tensor::from_ints(t, {L, 4}).to(device_);
  return e;
}

Tensor Flux2Pipeline::latent_ids(int64_t h, int64_t w) {
  std::vector<int64_t> ids(size_t(h * w * 4), 0);
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < w; ++c) {
      ids[size_t((r * w + c) * 4 + 1)] = r;
      ids[size_t((r * w + c) * 4 + 2)] = c;
    }
  return Tensor::from_ints(ids, {h * w, 4});
}

Tensor Flux2Pipeline::latents_to_vae_input(const Tensor& tokens, int64_t h, int64_t w) const {
  const int64_t b = tokens.dim(0), c = tokens.dim(2);
  // The ids are row-major (0, row, col, 0), so scattering tokens back by them is a transpose.
  Tensor x = contiguous(tokens.permute({0, 2, 1})).view({b, c, h, w});
  const DType dt = x.dtype();
  // sqrt(var + eps) in the statistics' (the VAE's) dtype, then cast, as diffusers.
  const Tensor mean = astype(vae->bn_running_mean, dt).view({1, c, 1, 1});
  const Tensor std =
      astype(sqrt(add(vae->bn_running_var, vae->config().batch_norm_eps)), dt).view({1, c, 1, 1});
  x = x * std + mean;
  return contiguous(x.view({b, c / 4, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3}))
      .view({b, c / 4, 2 * h, 2 * w});
}

PipelineOutput Flux2Pipeline::operator()(const Flux2CallOptions& o) {
  const PipelineDefaults d = pipeline_defaults();
  TESSERA_CHECK(!o.prompt.empty(), kWhere, " no prompt given");
  TESSERA_CHECK(o.num_images_per_prompt >= 1, kWhere, " num_images_per_prompt must be >= 1");
  const int64_t height = o.height.value_or(kDefaultSampleSize * vae_scale_factor_);
  const int64_t width = o.width.value_or(kDefaultSampleSize * vae_scale_factor_);
  const int64_t multiple = vae_scale_factor_ * 2;
  TESSERA_CHECK(height > 0 && width > 0 && height % multiple == 0 && width % multiple == 0, kWhere,
                " height and width must be positive multiples of ", multiple, "; got ", height, "x",
                width);
  const int steps = o.num_inference_steps.value_or(d.num_inference_steps);
  TESSERA_CHECK(steps >= 1, kWhere, " num_inference_steps must be >= 1; got ", steps);
  TESSERA_CHECK(o.max_sequence_length >= 1, kWhere, " max_sequence_length must be >= 1; got ",
                o.max_sequence_length);
  const double guidance_scale = o.guidance_scale.value_or(d.guidance_scale);
  // Checked before the encoder runs: the stacked layers are the transformer's context width.
  const int64_t context = int64_t(o.text_encoder_out_layers.size()) *
                          text_encoder->config().hidden_size;
  TESSERA_CHECK(context == transformer->config.joint_attention_dim, kWhere, " ",
                o.text_encoder_out_layers.size(), " text_encoder_out_layers x hidden_size ",
                text_encoder->config().hidden_size, " = ", context,
                " but the transformer's joint_attention_dim is ",
                transformer->config.joint_attention_dim);

  PipelineOutput out;
  const PromptEmbeds e = run_stage(Stage::encode, out, [&] {
    return encode_prompt(o.prompt, o.num_images_per_prompt, o.max_sequence_length,
                         o.text_encoder_out_layers);
  });

  const int64_t h = height / multiple, w = width / multiple;  // token grid
  const Tensor denoised = run_stage(Stage::denoise, out, [&] {
    const int64_t batch = e.prompt_embeds.dim(0);
    const int64_t channels = transformer->config.in_channels;
    Tensor latents;
    if (o.latents.defined()) {
      const Shape expected{batch, h * w, channels};
      TESSERA_CHECK(o.latents.shape() == expected, kWhere, " latents have shape ",
                    shape_str(o.latents.shape()), "; expected ", shape_str(expected));
      latents = astype(o.latents.to(device_), dtype_);
    } else {
      out.seed = o.seed ? *o.seed : std::random_device{}();
      Generator gen(out.seed);
      // Drawn patchified (B, 128, h, w), then packed to (B, h * w, 128): not FLUX.1's order.
      const Tensor noise = randn({batch, channels, h, w}, dtype_, gen).to(device_);
      latents = contiguous(noise.view({batch, channels, h * w}).permute({0, 2, 1}));
    }
    out.initial_latents = latents;
    const Tensor img_ids = latent_ids(h, w).to(device_);

    const std::vector<double> sigmas = o.sigmas ? *o.sigmas : np_linspace(1.0, 1.0 / steps, steps);
    scheduler->set_timesteps(steps, sigmas, compute_empirical_mu(latents.dim(1), steps));
    const Tensor guidance = full({batch}, float(guidance_scale), DType::f32).to(device_);

    denoising_loop(steps, out, o.on_step_end, [&](int i) {
      const float t = scheduler->timesteps()[size_t(i)];
      Flux2TransformerInputs in;
      in.hidden_states = latents;
      in.timestep = div(full({batch}, t, dtype_).to(device_), 1000.0);  // t.to(dtype) / 1000
      in.guidance = guidance;
      in.encoder_hidden_states = e.prompt_embeds;
      in.txt_ids = e.text_ids;
      in.img_ids = img_ids;
      const Tensor noise_pred = transformer->forward(in);
      latents = scheduler->step(noise_pred, i, latents);
      return latents;
    });
    return latents;
  });

  run_stage(Stage::decode, out, [&] {
    const OffloadScope scope = offload_scope(*vae);  // the statistics are the VAE's buffers
    const Tensor z = latents_to_vae_input(denoised, h, w);
    const Tensor decoded = vae->decode(z);
    out.image = postprocess_image(decoded.to(Device::cpu()));
    out.images = to_uint8_images(out.image);
  });
  return out;
}

}  // namespace tessera
