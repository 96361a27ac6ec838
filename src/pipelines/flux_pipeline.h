// FluxPipeline (FLUX.1-schnell and FLUX.1-dev) as diffusers runs it: CLIP pooled + T5 prompt
// embeddings, packed 2x2 latents from the torch-compatible generator, flow-match Euler steps,
// VAE decode and the image processor's post-processing.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/flux_transformer.h"
#include "models/t5_encoder.h"
#include "pipelines/diffusion_pipeline.h"
#include "schedulers/flow_match_euler_discrete.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace tessera {

struct FluxCallOptions {
  std::vector<std::string> prompt;                   // one image batch per prompt
  std::optional<std::vector<std::string>> prompt_2;  // T5 prompts (default: prompt)
  std::optional<int64_t> height, width;              // default: 128 * vae_scale_factor (1024)
  std::optional<int> num_inference_steps;            // default: 28 (diffusers' __call__)
  std::optional<double> guidance_scale;  // default: 3.5 (used only with guidance_embeds)
  int num_images_per_prompt = 1;
  std::optional<uint64_t> seed;  // torch.Generator("cpu").manual_seed(seed)
  Tensor latents;                // packed (B, L, 64) initial latents, optional
  int64_t max_sequence_length = 512;
  std::optional<std::vector<double>> sigmas;  // custom sigmas (default linspace(1, 1/N, N))
  StepCallback on_step_end;                   // called after each step
};

// The defaults of diffusers' FluxPipeline.__call__, the same for every FLUX.1 checkpoint:
// 28 steps, guidance 3.5 (used only by transformers with guidance_embeds), 512 T5 tokens.
// (FLUX.1-schnell's model card recommends 4 steps, guidance 0 and 256 tokens, which a caller
// passes explicitly, as in diffusers.)
using FluxDefaults = PipelineDefaults;

class FluxPipeline : public DiffusionPipeline {
 public:
  static std::unique_ptr<FluxPipeline> from_pretrained(const std::string& path,
                                                       const PipelineLoadOptions& options = {});
  static std::unique_ptr<FluxPipeline> from_folder(PipelineFolder folder,
                                                   const PipelineLoadOptions& options = {});
  PipelineOutput operator()(const FluxCallOptions& options);
  // DiffusionPipeline: the shared request mapped onto FluxCallOptions.
  PipelineOutput generate(const TextToImageOptions& options) override;
  PipelineDefaults pipeline_defaults() const override { return defaults(); }
  Module& denoiser() override { return *transformer; }

  struct PromptEmbeds {
    Tensor prompt_embeds;         // (B, L, joint_attention_dim)
    Tensor pooled_prompt_embeds;  // (B, pooled_projection_dim)
    Tensor text_ids;              // (L, 3) zeros
  };
  PromptEmbeds encode_prompt(const std::vector<std::string>& prompt,
                             const std::vector<std::string>& prompt_2, int num_images_per_prompt,
                             int64_t max_sequence_length);

  // diffusers' _pack_latents / _unpack_latents / _prepare_latent_image_ids.
  static Tensor pack_latents(const Tensor& latents);  // (B, C, H, W) -> (B, H/2*W/2, 4C)
  static Tensor unpack_latents(const Tensor& packed, int64_t height, int64_t width,
                               int64_t vae_scale_factor);
  static Tensor latent_image_ids(int64_t h, int64_t w, DType dtype);  // rows [0, row, col]

  FluxDefaults defaults() const;
  int64_t vae_scale_factor() const { return vae_scale_factor_; }

  std::unique_ptr<tokenizers::ClipTokenizer> tokenizer;
  std::unique_ptr<tokenizers::T5Tokenizer> tokenizer_2;
  std::unique_ptr<CLIPTextModel> text_encoder;
  std::unique_ptr<T5EncoderModel> text_encoder_2;
  std::unique_ptr<FluxTransformer2DModel> transformer;
  std::unique_ptr<AutoencoderKL> vae;
  std::unique_ptr<FlowMatchEulerDiscreteScheduler> scheduler;

 private:
  int64_t vae_scale_factor_ = 8;
  double scaling_factor_ = 0.3611, shift_factor_ = 0.1159;
};

}  // namespace tessera
