// diffusers' AutoencoderKL (models/autoencoders/autoencoder_kl.py) and AutoencoderKLFlux2
// (autoencoder_kl_flux2.py, the same encoder/decoder plus the BatchNorm statistics FLUX.2 uses
// to normalise patchified latents): the VAE of FLUX.1, SD3.x and FLUX.2.
//
// The model runs in the dtype it was loaded in. diffusers' force_upcast only matters to
// pipelines that run an fp16 VAE; FluxPipeline, StableDiffusion3Pipeline and Flux2Pipeline
// decode in the VAE's own dtype (bf16 included), and so does tessera.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "models/vae_blocks.h"
#include "nn/pretrained.h"
#include "runtime/random.h"

namespace tessera {

// The keys of an AutoencoderKL / AutoencoderKLFlux2 config.json that tessera reads. Shape keys
// are required; the rest take diffusers' defaults.
struct AutoencoderKLConfig {
  std::string class_name = "AutoencoderKL";  // or "AutoencoderKLFlux2"
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels;          // encoder (and decoder unless set below)
  std::vector<int64_t> decoder_block_out_channels;  // AutoencoderKLFlux2 only; else = above
  int64_t layers_per_block = 1;
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  std::string act_fn = "silu";
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  bool force_upcast = true;
  // For pipelines: decode(z) takes z = latents / scaling_factor + shift_factor.
  double scaling_factor = 0.18215;
  std::optional<double> shift_factor;
  std::vector<double> latents_mean, latents_std;  // empty when null
  // AutoencoderKLFlux2: BatchNorm2d over patch_size[0] * patch_size[1] * latent_channels.
  double batch_norm_eps = 1e-4;
  std::array<int64_t, 2> patch_size{2, 2};

  // Unsupported values (block types, activations, group counts) are refused naming the key and
  // the value.
  static AutoencoderKLConfig from_json(const JsonConfig& config);
  bool is_flux2() const { return class_name == "AutoencoderKLFlux2"; }
};

// diffusers' DiagonalGaussianDistribution over the encoder's moments.
struct DiagonalGaussianDistribution {
  Tensor parameters;  // (B, 2 * latent_channels, h, w): quant_conv(encoder(x)) or encoder(x)
  Tensor mean;        // first half of the channels (a view)
  Tensor logvar;      // second half, clamped to [-30, 20]
  Tensor std;         // exp(0.5 * logvar)
  Tensor var;         // exp(logvar)
  const Tensor& mode() const { return mean; }
  // mean + std * randn(mean.shape) drawn from `gen` in the parameters' dtype (randn_tensor).
  Tensor sample(Generator& gen) const;
};

class AutoencoderKL : public Module {
 public:
  explicit AutoencoderKL(const AutoencoderKLConfig& config);
  // Reads <folder>/config.json and loads the checkpoint converted to `dtype` (f32 or bf16).
  static std::unique_ptr<AutoencoderKL> from_pretrained(const std::string& component_folder,
                                                        DType dtype) {
    return load_pretrained<AutoencoderKL>(component_folder, dtype);
  }
  // For load_pretrained (nn/pretrained.h): older checkpoints name the attention's projections
  // query/key/value/proj_attn.
  static constexpr const char* kPretrainedName = "[AutoencoderKL]";
  static AutoencoderKLConfig config_from_json(const JsonConfig& c) {
    return AutoencoderKLConfig::from_json(c);
  }
  static std::unique_ptr<WeightSource> weight_source(const CheckpointWeightSource& checkpoint);
  static bool ignored_tensor(const std::string& name);
  void loaded(const WeightSource&, DType dtype) { dtype_ = dtype; }

  // z (B, latent_channels, h, w), already un-scaled by the pipeline -> sample (B, out, 8h, 8w)
  // for 4 blocks. With `capture`, records post_quant_conv (when present) and decoder.conv_in,
  // decoder.mid_block (and .resnets.N / .attentions.0), decoder.up_blocks.N,
  // decoder.conv_norm_out, decoder.conv_out.
  // Without `capture` it goes through Module::call (z in, sample out).
  Tensor decode(const Tensor& z, std::map<std::string, Tensor>* capture = nullptr) const;
  // sample (B, in_channels, H, W) -> the latent distribution. With `capture`, records
  // encoder.conv_in, encoder.down_blocks.N, encoder.mid_block (...), encoder.conv_norm_out,
  // encoder.conv_out and quant_conv (when present).
  DiagonalGaussianDistribution encode(const Tensor& sample,
                                      std::map<std::string, Tensor>* capture = nullptr) const;

  const AutoencoderKLConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  // Spatial factor between sample and latents: 2^(number of blocks - 1).
  int64_t scale_factor() const;

  vae::Encoder encoder;
  vae::Decoder decoder;
  std::unique_ptr<nn::Conv2d> quant_conv;       // 1x1, 2L -> 2L; when use_quant_conv
  std::unique_ptr<nn::Conv2d> post_quant_conv;  // 1x1, L -> L; when use_post_quant_conv
  // AutoencoderKLFlux2's bn.running_mean / bn.running_var (prod(patch_size) * L), in the model
  // dtype as diffusers converts buffers; undefined for AutoencoderKL.
  Tensor bn_running_mean, bn_running_var;

 private:
  Tensor decode_eager(const Tensor& z, std::map<std::string, Tensor>* capture) const;

  AutoencoderKLConfig config_;
  DType dtype_ = DType::f32;
};

}  // namespace tessera
