// StableDiffusion3Pipeline (SD3 / SD3.5) as diffusers runs it: CLIP-L and CLIP-G penultimate
// states and pooled text_embeds, T5 on the sequence (or zeros without text_encoder_3),
// classifier-free guidance as a batch [negative, positive], optional skip-layer guidance,
// flow-match Euler steps with the scheduler's static shift, VAE decode with scaling and shift.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/sd3_transformer.h"
#include "models/t5_encoder.h"
#include "pipelines/diffusion_pipeline.h"
#include "schedulers/flow_match_euler_discrete.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace tessera {

// StableDiffusion3Pipeline.__call__'s arguments; unset ones take its defaults.
struct SD3CallOptions {
  std::vector<std::string> prompt;  // CLIP-L (and the others unless given)
  std::optional<std::vector<std::string>> prompt_2, prompt_3;  // CLIP-G, T5
  // Default "" (an empty negative prompt); _2 and _3 default to negative_prompt. One value or
  // one per prompt.
  std::optional<std::vector<std::string>> negative_prompt, negative_prompt_2, negative_prompt_3;
  std::optional<int64_t> height, width;    // default: sample_size * vae_scale_factor
  std::optional<int> num_inference_steps;  // default 28
  std::optional<double> guidance_scale;    // default 7.0; > 1 enables classifier-free guidance
  int num_images_per_prompt = 1;
  std::optional<uint64_t> seed;  // torch.Generator("cpu").manual_seed(seed)
  Tensor latents;                // (B, C, H/8, W/8) initial latents, optional
  int64_t max_sequence_length = 256;
  std::optional<int> clip_skip;  // CLIP layers skipped from the end (positive prompt only)
  // Skip-layer guidance (SD3.5-medium's model card: {7, 8, 9}); only with guidance.
  std::vector<int64_t> skip_guidance_layers;
  double skip_layer_guidance_scale = 2.8;
  double skip_layer_guidance_stop = 0.2;
  double skip_layer_guidance_start = 0.01;
  StepCallback on_step_end;
};

class StableDiffusion3Pipeline : public DiffusionPipeline {
 public:
  static std::unique_ptr<StableDiffusion3Pipeline> from_pretrained(
      const std::string& path, const PipelineLoadOptions& options = {});
  static std::unique_ptr<StableDiffusion3Pipeline> from_folder(
      PipelineFolder folder, const PipelineLoadOptions& options = {});
  PipelineOutput operator()(const SD3CallOptions& options);
  PipelineOutput generate(const TextToImageOptions& options) override;
  // diffusers' __call__ defaults: 28 steps, guidance 7.0, 256 T5 tokens.
  PipelineDefaults pipeline_defaults() const override { return {28, 7.0, 256}; }
  Module& denoiser() override { return *transformer; }

  // The token ids each encoder gets (CLIP-L, CLIP-G: 77; T5: max_sequence_length).
  struct TokenIds {
    Tensor clip_l, clip_g, t5;  // t5 undefined without text_encoder_3
  };
  TokenIds tokenize(const std::vector<std::string>& prompt,
                    const std::vector<std::string>& prompt_2,
                    const std::vector<std::string>& prompt_3, int64_t max_sequence_length) const;

  struct PromptEmbeds {
    Tensor prompt_embeds;         // (B*n, 77 + max_sequence_length, joint_attention_dim)
    Tensor pooled_prompt_embeds;  // (B*n, pooled_projection_dim)
    Tensor negative_prompt_embeds, negative_pooled_prompt_embeds;  // with guidance only
  };
  // encode_prompt: prompts resolved as SD3CallOptions says; the negative ones only when
  // `classifier_free_guidance`.
  PromptEmbeds encode_prompt(const SD3CallOptions& options, bool classifier_free_guidance);

  int64_t vae_scale_factor() const { return vae_scale_factor_; }
  int64_t default_size() const { return transformer->config.sample_size * vae_scale_factor_; }

  std::unique_ptr<tokenizers::ClipTokenizer> tokenizer, tokenizer_2;
  std::unique_ptr<tokenizers::T5Tokenizer> tokenizer_3;  // null without text_encoder_3
  std::unique_ptr<CLIPTextModelWithProjection> text_encoder, text_encoder_2;
  std::unique_ptr<T5EncoderModel> text_encoder_3;  // null: zeros, as diffusers
  std::unique_ptr<SD3Transformer2DModel> transformer;
  std::unique_ptr<AutoencoderKL> vae;
  std::unique_ptr<FlowMatchEulerDiscreteScheduler> scheduler;

 private:
  // (per-token states, pooled) of one CLIP model for a list of prompts, n images each.
  std::pair<Tensor, Tensor> clip_embeds(int index, const Tensor& ids, std::optional<int> clip_skip,
                                        int n) const;
  int64_t vae_scale_factor_ = 8;
  double scaling_factor_ = 1.5305, shift_factor_ = 0.0609;
};

}  // namespace tessera
