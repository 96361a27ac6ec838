#include "pipelines/flux_pipeline.h"

#include <cstdio>
#include <random>

#include "io/model_folder.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace tessera {
namespace {

constexpr int64_t kDefaultSampleSize = 128;  // FluxPipeline.default_sample_size

}  // namespace

std::unique_ptr<FluxPipeline> FluxPipeline::from_pretrained(const std::string& path,
                                                            const PipelineLoadOptions& opt) {
  return from_folder(open_pipeline_folder(path), opt);
}

std::unique_ptr<FluxPipeline> FluxPipeline::from_folder(PipelineFolder folder,
                                                        const PipelineLoadOptions& opt) {
  const std::string path = folder.path;
  auto p = std::make_unique<FluxPipeline>();
  p->begin_loading(std::move(folder), "FluxPipeline", opt);
  p->tokenizer = std::make_unique<tokenizers::ClipTokenizer>(
      tokenizers::ClipTokenizer::from_folder(p->component("tokenizer").path));
  p->tokenizer_2 = std::make_unique<tokenizers::T5Tokenizer>(
      tokenizers::T5Tokenizer::from_folder(p->component("tokenizer_2").path));
  p->text_encoder = p->load_model<CLIPTextModel>("text_encoder");
  p->text_encoder_2 = p->load_model<T5EncoderModel>("text_encoder_2");
  p->transformer = p->load_model<FluxTransformer2DModel>("transformer");
  p->vae = p->load_model<AutoencoderKL>("vae");
  const ComponentInfo& sched = p->component("scheduler");
  TESSERA_CHECK(sched.class_name == "FlowMatchEulerDiscreteScheduler", path, ": scheduler class '",
                sched.class_name, "' is not supported; expected FlowMatchEulerDiscreteScheduler");
  p->scheduler = std::make_unique<FlowMatchEulerDiscreteScheduler>(
      FlowMatchEulerDiscreteConfig::from_json_file(sched.config_path));
  // The loaded VAE's config: its folder is not read again.
  const AutoencoderKLConfig& vae_cfg = p->vae->config();
  p->vae_scale_factor_ = p->vae->scale_factor();
  p->scaling_factor_ = vae_cfg.scaling_factor;
  p->shift_factor_ = vae_cfg.shift_factor.value_or(0.0);
  p->finish_loading(opt);
  return p;
}

PipelineOutput FluxPipeline::generate(const TextToImageOptions& o) {
  TESSERA_CHECK(!o.prompt_3, "[FluxPipeline] has two text encoders: prompt_3 (--prompt-3) is for "
                "pipelines with a third one (StableDiffusion3Pipeline)");
  TESSERA_CHECK(!o.negative_prompt, "[FluxPipeline] runs without classifier-free guidance: "
                "negative_prompt (--negative-prompt) is not supported");
  TESSERA_CHECK(!o.text_encoder_out_layers, "[FluxPipeline] takes T5's last hidden state: "
                "text_encoder_out_layers (--text-encoder-out-layers) is for Flux2Pipeline");
  FluxCallOptions call;
  call.prompt = o.prompt;
  call.prompt_2 = o.prompt_2;
  call.height = o.height;
  call.width = o.width;
  call.num_inference_steps = o.num_inference_steps;
  call.guidance_scale = o.guidance_scale;
  call.num_images_per_prompt = o.num_images_per_prompt;
  call.seed = o.seed;
  call.max_sequence_length = o.max_sequence_length.value_or(defaults().max_sequence_length);
  call.on_step_end = o.on_step_end;
  return (*this)(call);
}

FluxDefaults FluxPipeline::defaults() const { return {28, 3.5, 512}; }

FluxPipeline::PromptEmbeds FluxPipeline::encode_prompt(const std::vector<std::string>& prompt,
                                                       const std::vector<std::string>& prompt_2,
                                                       int n, int64_t max_sequence_length) {
  std::vector<tokenizers::Encoding> clip_ids, t5_ids;
  for (const auto& s : prompt) {
    clip_ids.push_back(tokenizer->encode(s));
    if (clip_ids.back().num_truncated > 0)
      std::fprintf(stderr,
                   "tessera: warning: the prompt was truncated because CLIP can only handle "
                   "sequences up to %lld tokens (%lld tokens removed)\n",
                   (long long)tokenizer->model_max_length(),
                   (long long)clip_ids.back().num_truncated);
  }
  for (const auto& s : prompt_2) {
    t5_ids.push_back(tokenizer_2->encode(s, max_sequence_length));
    if (t5_ids.back().num_truncated > 0)
      std::fprintf(stderr,
                   "tessera: warning: part of prompt_2 was truncated because max_sequence_length "
                   "is set to %lld tokens (%lld tokens removed)\n",
                   (long long)max_sequence_length, (long long)t5_ids.back().num_truncated);
  }
  PromptEmbeds e;
  Tensor pooled, t5;
  {
    const OffloadScope scope = offload_scope(*text_encoder);
    pooled = text_encoder->forward(tokenizers::to_tensors(clip_ids).first.to(device_))
                 .pooler_output;
  }
  {
    const OffloadScope scope = offload_scope(*text_encoder_2);
    t5 = text_encoder_2->forward(tokenizers::to_tensors(t5_ids).first.to(device_))
             .last_hidden_state;
  }
  e.pooled_prompt_embeds = repeat_rows(astype(pooled, dtype_), n);
  e.prompt_embeds = repeat_rows(astype(t5, dtype_), n);
  e.text_ids = Tensor::zeros({e.prompt_embeds.dim(1), 3}, dtype_).to(device_);
  return e;
}

Tensor FluxPipeline::pack_latents(const Tensor& x) {
  const int64_t b = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  return contiguous(x.view({b, c, h / 2, 2, w / 2, 2}).permute({0, 2, 4, 1, 3, 5}))
      .view({b, (h / 2) * (w / 2), c * 4});
}

Tensor FluxPipeline::unpack_latents(const Tensor& x, int64_t height, int64_t width,
                                    int64_t vae_scale_factor) {
  const int64_t b = x.dim(0), channels = x.dim(2);
  const int64_t h = 2 * (height / (vae_scale_factor * 2)), w = 2 * (width / (vae_scale_factor * 2));
  return contiguous(x.view({b, h / 2, w / 2, channels / 4, 2, 2}).permute({0, 3, 1, 4, 2, 5}))
      .view({b, channels / 4, h, w});
}

Tensor FluxPipeline::latent_image_ids(int64_t h, int64_t w, DType dtype) {
  std::vector<float> ids(size_t(h * w * 3), 0.f);
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < w; ++c) {
      ids[size_t((r * w + c) * 3 + 1)] = float(r);
      ids[size_t((r * w + c) * 3 + 2)] = float(c);
    }
  return Tensor::from_floats(ids, {h * w, 3}, dtype);
}

PipelineOutput FluxPipeline::operator()(const FluxCallOptions& o) {
  const FluxDefaults d = defaults();
  TESSERA_CHECK(!o.prompt.empty(), "[FluxPipeline] no prompt given");
  const std::vector<std::string>& prompt_2 = o.prompt_2 ? *o.prompt_2 : o.prompt;
  TESSERA_CHECK(prompt_2.size() == o.prompt.size(), "[FluxPipeline] ", o.prompt.size(),
                " prompts but ", prompt_2.size(), " prompt_2 values");
  TESSERA_CHECK(o.num_images_per_prompt >= 1, "[FluxPipeline] num_images_per_prompt must be >= 1");
  const int64_t height = o.height.value_or(kDefaultSampleSize * vae_scale_factor_);
  const int64_t width = o.width.value_or(kDefaultSampleSize * vae_scale_factor_);
  const int64_t multiple = vae_scale_factor_ * 2;
  TESSERA_CHECK(height > 0 && width > 0 && height % multiple == 0 && width % multiple == 0,
                "[FluxPipeline] height and width must be positive multiples of ", multiple,
                "; got ", height, "x", width);
  const int steps = o.num_inference_steps.value_or(d.num_inference_steps);
  TESSERA_CHECK(steps >= 1, "[FluxPipeline] num_inference_steps must be >= 1; got ", steps);
  TESSERA_CHECK(o.max_sequence_length >= 1 && o.max_sequence_length <= 512,
                "[FluxPipeline] max_sequence_length must be in [1, 512]; got ",
                o.max_sequence_length);
  const double guidance_scale = o.guidance_scale.value_or(d.guidance_scale);

  PipelineOutput out;
  const PromptEmbeds e = run_stage(Stage::encode, out, [&] {
    return encode_prompt(o.prompt, prompt_2, o.num_images_per_prompt, o.max_sequence_length);
  });

  const Tensor denoised = run_stage(Stage::denoise, out, [&] {
    const int64_t batch = e.prompt_embeds.dim(0);
    const int64_t lh = 2 * (height / multiple), lw = 2 * (width / multiple);
    const int64_t channels = transformer->config.in_channels / 4;
    Tensor latents;
    if (o.latents.defined()) {
      const Shape expected{batch, (lh / 2) * (lw / 2), channels * 4};
      TESSERA_CHECK(o.latents.shape() == expected, "[FluxPipeline] latents have shape ",
                    shape_str(o.latents.shape()), "; expected ", shape_str(expected));
      latents = astype(o.latents.to(device_), dtype_);
    } else {
      out.seed = o.seed ? *o.seed : std::random_device{}();
      Generator gen(out.seed);
      latents = pack_latents(randn({batch, channels, lh, lw}, dtype_, gen).to(device_));
    }
    out.initial_latents = latents;
    const Tensor img_ids = latent_image_ids(lh / 2, lw / 2, dtype_).to(device_);

    std::vector<double> sigmas = o.sigmas ? *o.sigmas : np_linspace(1.0, 1.0 / steps, steps);
    const auto& sc = scheduler->config();
    const double mu = calculate_shift(latents.dim(1), sc.base_image_seq_len, sc.max_image_seq_len,
                                      sc.base_shift, sc.max_shift);
    scheduler->set_timesteps(steps, sigmas, mu);
    Tensor guidance;
    if (transformer->config.guidance_embeds)
      guidance = full({batch}, float(guidance_scale), DType::f32).to(device_);

    denoising_loop(steps, out, o.on_step_end, [&](int i) {
      const float t = scheduler->timesteps()[size_t(i)];
      FluxTransformerInputs in;
      in.hidden_states = latents;
      in.timestep = div(full({batch}, t, dtype_).to(device_), 1000.0);  // t.to(dtype) / 1000
      in.guidance = guidance;
      in.pooled_projections = e.pooled_prompt_embeds;
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
    Tensor z = unpack_latents(denoised, height, width, vae_scale_factor_);
    z = add(div(z, scaling_factor_), shift_factor_);
    const OffloadScope scope = offload_scope(*vae);
    const Tensor decoded = vae->decode(z);
    out.image = postprocess_image(decoded.to(Device::cpu()));
    out.images = to_uint8_images(out.image);
  });
  return out;
}

}  // namespace tessera
