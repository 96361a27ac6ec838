#include "pipelines/sd3_pipeline.h"

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

constexpr const char* kWhere = "[StableDiffusion3Pipeline]";

// A per-prompt list: the given one, else `fallback`; one value is repeated for every prompt.
std::vector<std::string> resolve(const std::optional<std::vector<std::string>>& given,
                                 const std::vector<std::string>& fallback, size_t batch,
                                 const char* name) {
  std::vector<std::string> v = given ? *given : fallback;
  if (v.size() == 1 && batch > 1) v.assign(batch, v[0]);
  TESSERA_CHECK(v.size() == batch, kWhere, " ", name, " has ", v.size(), " values for ", batch,
                " prompts");
  return v;
}

void warn_truncated(const tokenizers::Encoding& e, const char* what, int64_t max_length) {
  if (e.num_truncated > 0)
    std::fprintf(stderr,
                 "tessera: warning: part of the %s was truncated to %lld tokens (%lld tokens "
                 "removed)\n",
                 what, (long long)max_length, (long long)e.num_truncated);
}

}  // namespace

std::unique_ptr<StableDiffusion3Pipeline> StableDiffusion3Pipeline::from_pretrained(
    const std::string& path, const PipelineLoadOptions& opt) {
  return from_folder(open_pipeline_folder(path), opt);
}

std::unique_ptr<StableDiffusion3Pipeline> StableDiffusion3Pipeline::from_folder(
    PipelineFolder folder, const PipelineLoadOptions& opt) {
  const std::string path = folder.path;
  auto p = std::make_unique<StableDiffusion3Pipeline>();
  p->begin_loading(std::move(folder), "StableDiffusion3Pipeline", opt);
  p->tokenizer = std::make_unique<tokenizers::ClipTokenizer>(
      tokenizers::ClipTokenizer::from_folder(p->component("tokenizer").path));
  p->tokenizer_2 = std::make_unique<tokenizers::ClipTokenizer>(
      tokenizers::ClipTokenizer::from_folder(p->component("tokenizer_2").path));
  const bool t5 = p->has_component("text_encoder_3");
  if (t5)
    p->tokenizer_3 = std::make_unique<tokenizers::T5Tokenizer>(
        tokenizers::T5Tokenizer::from_folder(p->component("tokenizer_3").path));
  // In model_cpu_offload_seq order: text_encoder, text_encoder_2, text_encoder_3, transformer,
  // vae.
  p->text_encoder = p->load_model<CLIPTextModelWithProjection>("text_encoder");
  p->text_encoder_2 = p->load_model<CLIPTextModelWithProjection>("text_encoder_2");
  if (t5) p->text_encoder_3 = p->load_model<T5EncoderModel>("text_encoder_3");
  p->transformer = p->load_model<SD3Transformer2DModel>("transformer");
  p->vae = p->load_model<AutoencoderKL>("vae");
  const ComponentInfo& sched = p->component("scheduler");
  TESSERA_CHECK(sched.class_name == "FlowMatchEulerDiscreteScheduler", path, ": scheduler class '",
                sched.class_name, "' is not supported; expected FlowMatchEulerDiscreteScheduler");
  p->scheduler = std::make_unique<FlowMatchEulerDiscreteScheduler>(
      FlowMatchEulerDiscreteConfig::from_json_file(sched.config_path));
  const auto& tc = p->transformer->config;
  const int64_t clip_width =
      p->text_encoder->config().hidden_size + p->text_encoder_2->config().hidden_size;
  const int64_t t5_width = t5 ? p->text_encoder_3->config.d_model : tc.joint_attention_dim;
  TESSERA_CHECK(clip_width <= t5_width && t5_width == tc.joint_attention_dim, path,
                ": the text encoders' widths (CLIP-L + CLIP-G ", clip_width, ", T5 ", t5_width,
                ") do not fit the transformer's joint_attention_dim ", tc.joint_attention_dim);
  const int64_t pooled =
      p->text_encoder->config().projection_dim + p->text_encoder_2->config().projection_dim;
  TESSERA_CHECK(pooled == tc.pooled_projection_dim, path, ": the CLIP projections (", pooled,
                ") do not match the transformer's pooled_projection_dim ",
                tc.pooled_projection_dim);
  p->vae_scale_factor_ = p->vae->scale_factor();
  p->scaling_factor_ = p->vae->config().scaling_factor;
  p->shift_factor_ = p->vae->config().shift_factor.value_or(0.0);
  p->finish_loading(opt);
  return p;
}

PipelineOutput StableDiffusion3Pipeline::generate(const TextToImageOptions& o) {
  TESSERA_CHECK(!o.text_encoder_out_layers, "[StableDiffusion3Pipeline] chooses its text "
                "encoders' layers with clip_skip: text_encoder_out_layers "
                "(--text-encoder-out-layers) is for Flux2Pipeline");
  SD3CallOptions call;
  call.prompt = o.prompt;
  call.prompt_2 = o.prompt_2;
  call.prompt_3 = o.prompt_3;
  call.negative_prompt = o.negative_prompt;
  call.height = o.height;
  call.width = o.width;
  call.num_inference_steps = o.num_inference_steps;
  call.guidance_scale = o.guidance_scale;
  call.num_images_per_prompt = o.num_images_per_prompt;
  call.seed = o.seed;
  call.max_sequence_length =
      o.max_sequence_length.value_or(pipeline_defaults().max_sequence_length);
  call.on_step_end = o.on_step_end;
  return (*this)(call);
}

StableDiffusion3Pipeline::TokenIds StableDiffusion3Pipeline::tokenize(
    const std::vector<std::string>& prompt, const std::vector<std::string>& prompt_2,
    const std::vector<std::string>& prompt_3, int64_t max_sequence_length) const {
  std::vector<tokenizers::Encoding> l, g, t;
  for (const auto& s : prompt) {
    l.push_back(tokenizer->encode(s));
    warn_truncated(l.back(), "prompt (CLIP)", tokenizer->model_max_length());
  }
  for (const auto& s : prompt_2) {
    g.push_back(tokenizer_2->encode(s));
    warn_truncated(g.back(), "prompt_2 (CLIP-G)", tokenizer_2->model_max_length());
  }
  TokenIds ids{tokenizers::to_tensors(l).first, tokenizers::to_tensors(g).first, Tensor()};
  if (tokenizer_3) {
    for (const auto& s : prompt_3) {
      t.push_back(tokenizer_3->encode(s, max_sequence_length));
      warn_truncated(t.back(), "prompt_3 (T5)", max_sequence_length);
    }
    ids.t5 = tokenizers::to_tensors(t).first;
  }
  return ids;
}

std::pair<Tensor, Tensor> StableDiffusion3Pipeline::clip_embeds(int index, const Tensor& ids,
                                                                std::optional<int> clip_skip,
                                                                int n) const {
  const CLIPTextModelWithProjection& m = index == 0 ? *text_encoder : *text_encoder_2;
  const CLIPTextOutput r = m.forward(ids.to(device_), nullptr, {.output_hidden_states = true});
  // hidden_states[-2], or [-(clip_skip + 2)]: the embeddings count as entry 0.
  const int64_t back = clip_skip ? *clip_skip + 2 : 2;
  TESSERA_CHECK(back <= int64_t(r.hidden_states.size()), kWhere, " clip_skip ", *clip_skip,
                " is more than this CLIP model's ", r.hidden_states.size() - 2, " layers allow");
  const Tensor states = r.hidden_states[r.hidden_states.size() - size_t(back)];
  return {repeat_rows(astype(states, dtype_), n), repeat_rows(astype(r.text_embeds, dtype_), n)};
}

StableDiffusion3Pipeline::PromptEmbeds StableDiffusion3Pipeline::encode_prompt(
    const SD3CallOptions& o, bool cfg) {
  const size_t batch = o.prompt.size();
  const int n = o.num_images_per_prompt;
  const int64_t max_len = o.max_sequence_length;
  const TokenIds pos = tokenize(o.prompt, resolve(o.prompt_2, o.prompt, batch, "prompt_2"),
                                resolve(o.prompt_3, o.prompt, batch, "prompt_3"), max_len);
  TokenIds neg;
  if (cfg) {
    const auto neg1 = resolve(o.negative_prompt, {""}, batch, "negative_prompt");
    neg = tokenize(neg1, resolve(o.negative_prompt_2, neg1, batch, "negative_prompt_2"),
                   resolve(o.negative_prompt_3, neg1, batch, "negative_prompt_3"), max_len);
  }
  // Each encoder runs the positive then the negative prompts while its weights are held.
  // diffusers gives clip_skip to the positive prompts only.
  std::pair<Tensor, Tensor> l, g, nl, ng;
  {
    const OffloadScope scope = offload_scope(*text_encoder);
    l = clip_embeds(0, pos.clip_l, o.clip_skip, n);
    if (cfg) nl = clip_embeds(0, neg.clip_l, std::nullopt, n);
  }
  {
    const OffloadScope scope = offload_scope(*text_encoder_2);
    g = clip_embeds(1, pos.clip_g, o.clip_skip, n);
    if (cfg) ng = clip_embeds(1, neg.clip_g, std::nullopt, n);
  }
  const int64_t width = transformer->config.joint_attention_dim;
  auto t5 = [&](const Tensor& ids) {
    if (!text_encoder_3)  // no T5: zeros, as diffusers
      return Tensor::zeros({int64_t(batch) * n, max_len, width}, dtype_).to(device_);
    return repeat_rows(astype(text_encoder_3->forward(ids.to(device_)).last_hidden_state, dtype_), n);
  };
  Tensor t, nt;
  {
    const OffloadScope scope =
        text_encoder_3 ? offload_scope(*text_encoder_3) : OffloadScope{nullptr, offload_};
    t = t5(pos.t5);
    if (cfg) nt = t5(neg.t5);
  }
  // [CLIP-L | CLIP-G | zeros up to T5's width] then T5 on the sequence; pooled L | G.
  auto joint = [&](const Tensor& cl, const Tensor& cg, const Tensor& t5e) {
    const Tensor clip = concat({cl, cg}, 2);
    return concat({pad(clip, {0, t5e.dim(2) - clip.dim(2)}), t5e}, 1);
  };
  PromptEmbeds e;
  e.prompt_embeds = joint(l.first, g.first, t);
  e.pooled_prompt_embeds = concat({l.second, g.second}, 1);
  if (cfg) {
    e.negative_prompt_embeds = joint(nl.first, ng.first, nt);
    e.negative_pooled_prompt_embeds = concat({nl.second, ng.second}, 1);
  }
  return e;
}

PipelineOutput StableDiffusion3Pipeline::operator()(const SD3CallOptions& o) {
  const PipelineDefaults d = pipeline_defaults();
  TESSERA_CHECK(!o.prompt.empty(), kWhere, " no prompt given");
  TESSERA_CHECK(o.num_images_per_prompt >= 1, kWhere, " num_images_per_prompt must be >= 1");
  const int64_t height = o.height.value_or(default_size());
  const int64_t width = o.width.value_or(default_size());
  const int64_t multiple = vae_scale_factor_ * transformer->config.patch_size;
  TESSERA_CHECK(height > 0 && width > 0 && height % multiple == 0 && width % multiple == 0, kWhere,
                " height and width must be positive multiples of ", multiple, "; got ", height, "x",
                width);
  const int steps = o.num_inference_steps.value_or(d.num_inference_steps);
  TESSERA_CHECK(steps >= 1, kWhere, " num_inference_steps must be >= 1; got ", steps);
  TESSERA_CHECK(o.max_sequence_length >= 1 && o.max_sequence_length <= 512, kWhere,
                " max_sequence_length must be in [1, 512]; got ", o.max_sequence_length);
  TESSERA_CHECK(!o.clip_skip || *o.clip_skip >= 0, kWhere, " clip_skip must be >= 0");
  for (int64_t l : o.skip_guidance_layers)
    TESSERA_CHECK(l >= 0 && l < transformer->config.num_layers, kWhere,
                  " skip_guidance_layers names layer ", l, "; the transformer has layers 0..",
                  transformer->config.num_layers - 1);
  const double guidance_scale = o.guidance_scale.value_or(d.guidance_scale);
  const bool cfg = guidance_scale > 1.0;

  PipelineOutput out;
  const PromptEmbeds e = run_stage(Stage::encode, out, [&] { return encode_prompt(o, cfg); });

  const Tensor denoised = run_stage(Stage::denoise, out, [&] {
    const Tensor prompt_embeds =
        cfg ? concat({e.negative_prompt_embeds, e.prompt_embeds}, 0) : e.prompt_embeds;
    const Tensor pooled = cfg ? concat({e.negative_pooled_prompt_embeds, e.pooled_prompt_embeds}, 0)
                              : e.pooled_prompt_embeds;
    const int64_t batch = e.prompt_embeds.dim(0);
    const Shape shape{batch, transformer->config.in_channels, height / vae_scale_factor_,
                      width / vae_scale_factor_};
    Tensor latents;
    if (o.latents.defined()) {
      TESSERA_CHECK(o.latents.shape() == shape, kWhere, " latents have shape ",
                    shape_str(o.latents.shape()), "; expected ", shape_str(shape));
      latents = astype(o.latents.to(device_), dtype_);
    } else {
      out.seed = o.seed ? *o.seed : std::random_device{}();
      Generator gen(out.seed);
      latents = randn(shape, dtype_, gen).to(device_);
    }
    out.initial_latents = latents;

    const auto& sc = scheduler->config();
    std::optional<double> mu;
    if (sc.use_dynamic_shifting) {
      const int64_t p = transformer->config.patch_size;
      mu = calculate_shift((shape[2] / p) * (shape[3] / p), sc.base_image_seq_len,
                           sc.max_image_seq_len, sc.base_shift, sc.max_shift);
    }
    scheduler->set_timesteps(steps, std::nullopt, mu);

    denoising_loop(steps, out, o.on_step_end, [&](int i) {
      const float t = scheduler->timesteps()[size_t(i)];
      SD3TransformerInputs in;
      in.hidden_states = cfg ? concat({latents, latents}, 0) : latents;
      // The scheduler's float32 timestep, expanded over the batch (not cast to the model dtype).
      in.timestep = Tensor::from_floats(std::vector<float>(size_t(in.hidden_states.dim(0)), t),
                                        {in.hidden_states.dim(0)})
                        .to(device_);
      in.encoder_hidden_states = prompt_embeds;
      in.pooled_projections = pooled;
      Tensor noise_pred = transformer->forward(in);
      if (cfg) {
        const auto parts = chunk(noise_pred, 2, 0);
        const Tensor& uncond = parts[0];
        const Tensor& text = parts[1];
        noise_pred = uncond + (text - uncond) * guidance_scale;
        const bool skip = double(i) > steps * o.skip_layer_guidance_start &&
                          double(i) < steps * o.skip_layer_guidance_stop;
        if (!o.skip_guidance_layers.empty() && skip) {
          SD3TransformerInputs s;
          s.hidden_states = latents;
          s.timestep = Tensor::from_floats(std::vector<float>(size_t(batch), t), {batch}).to(device_);
          s.encoder_hidden_states = e.prompt_embeds;
          s.pooled_projections = e.pooled_prompt_embeds;
          s.skip_layers = o.skip_guidance_layers;
          const Tensor skipped = transformer->forward(s);
          noise_pred = noise_pred + (text - skipped) * o.skip_layer_guidance_scale;
        }
      }
      latents = scheduler->step(noise_pred, i, latents);
      return latents;
    });
    return latents;
  });

  run_stage(Stage::decode, out, [&] {
    const Tensor z = add(div(denoised, scaling_factor_), shift_factor_);
    const OffloadScope scope = offload_scope(*vae);
    const Tensor decoded = vae->decode(z);
    out.image = postprocess_image(decoded.to(Device::cpu()));
    out.images = to_uint8_images(out.image);
  });
  return out;
}

}  // namespace tessera
