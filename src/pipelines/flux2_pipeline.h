// Flux2Pipeline (FLUX.2-dev) as diffusers runs it for text-to-image: the Mistral chat prompt
// through the Mistral3 language model (hidden states of layers 10, 20, 30 stacked), noise drawn
// in the patchified shape and packed to tokens, flow-match Euler steps with the empirical mu,
// then the tokens scattered back, de-normalised with the VAE's BatchNorm statistics,
// un-patchified and decoded.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/autoencoder_kl.h"
#include "models/flux2_transformer.h"
#include "models/mistral3_text_model.h"
#include "pipelines/diffusion_pipeline.h"
#include "schedulers/flow_match_euler_discrete.h"
#include "tokenizers/bpe_tokenizer.h"

namespace tessera {

struct Flux2CallOptions {
  std::vector<std::string> prompt;
  std::optional<int64_t> height, width;    // default: 128 * vae_scale_factor (1024)
  std::optional<int> num_inference_steps;  // default: 50 (diffusers' __call__)
  std::optional<double> guidance_scale;    // default: 4.0
  int num_images_per_prompt = 1;
  std::optional<uint64_t> seed;  // torch.Generator("cpu").manual_seed(seed)
  Tensor latents;                // packed (B, L, 128) initial latents, optional
  int64_t max_sequence_length = 512;
  std::optional<std::vector<double>> sigmas;  // default linspace(1, 1/N, N)
  std::vector<int64_t> text_encoder_out_layers{10, 20, 30};
  StepCallback on_step_end;
};

class Flux2Pipeline : public DiffusionPipeline {
 public:
  // The pipeline's system message (diffusers' flux2 SYSTEM_MESSAGE), part of every prompt.
  static const char* const kSystemMessage;

  static std::unique_ptr<Flux2Pipeline> from_pretrained(const std::string& path,
                                                        const PipelineLoadOptions& options = {});
  static std::unique_ptr<Flux2Pipeline> from_folder(PipelineFolder folder,
                                                    const PipelineLoadOptions& options = {});
  PipelineOutput operator()(const Flux2CallOptions& options);
  PipelineOutput generate(const TextToImageOptions& options) override;
  PipelineDefaults pipeline_defaults() const override { return {50, 4.0, 512}; }
  Module& denoiser() override { return *transformer; }

  struct PromptEmbeds {
    Tensor prompt_embeds;              // (B, L, 3 * hidden_size) in the pipeline dtype
    Tensor text_ids;                   // (L, 4) int64 rows (0, 0, 0, l)
    Tensor input_ids, attention_mask;  // what the text encoder got
  };
  PromptEmbeds encode_prompt(const std::vector<std::string>& prompt, int num_images_per_prompt,
                             int64_t max_sequence_length,
                             const std::vector<int64_t>& text_encoder_out_layers = {10, 20, 30});

  // Position ids (h * w, 4) int64 rows (0, row, col, 0), as _prepare_latent_ids.
  static Tensor latent_ids(int64_t h, int64_t w);
  // (B, h * w, C) tokens -> the VAE's input: (B, C, h, w), x * sqrt(var + eps) + mean with the
  // BatchNorm statistics, un-patchified 2x2 to (B, C / 4, 2h, 2w). The VAE's weights must be
  // present (inside its offload scope).
  Tensor latents_to_vae_input(const Tensor& tokens, int64_t h, int64_t w) const;
  int64_t vae_scale_factor() const { return vae_scale_factor_; }

  std::unique_ptr<tokenizers::BpeTokenizer> tokenizer;
  std::unique_ptr<Mistral3TextModel> text_encoder;
  std::unique_ptr<Flux2Transformer2DModel> transformer;
  std::unique_ptr<AutoencoderKL> vae;
  std::unique_ptr<FlowMatchEulerDiscreteScheduler> scheduler;

 private:
  int64_t vae_scale_factor_ = 8;
};

}  // namespace tessera
