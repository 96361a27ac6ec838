// make_synthetic_checkpoint: a diffusers pipeline folder with the published configs and seeded
// random weights of the real sizes, sharded as published, so scale (memory, offload, load
// times) can be tested without the real weights. Weights stream to disk tensor by tensor; the
// whole model is never in memory. Configs: see docs/decisions/0011-offload.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/json_config.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/flux2_transformer.h"
#include "models/flux_transformer.h"
#include "models/sd3_transformer.h"
#include "models/mistral3_text_model.h"
#include "models/t5_encoder.h"
#include "runtime/error.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace tessera {
namespace {

// black-forest-labs/FLUX.1-schnell as published (diffusers folder, revision 741f7c3c).
const char* kSchnellTransformer = R"({
  "_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0.dev0",
  "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": false,
  "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
  "num_single_layers": 38, "out_channels": null, "patch_size": 1, "pooled_projection_dim": 768})";
const char* kClipL = R"({
  "architectures": ["CLIPTextModel"], "attention_dropout": 0.0, "bos_token_id": 0,
  "dropout": 0.0, "eos_token_id": 2, "hidden_act": "quick_gelu", "hidden_size": 768,
  "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 3072,
  "layer_norm_eps": 1e-05, "max_position_embeddings": 77, "model_type": "clip_text_model",
  "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "projection_dim": 768,
  "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "vocab_size": 49408})";
const char* kT5Xxl = R"({
  "architectures": ["T5EncoderModel"], "classifier_dropout": 0.0, "d_ff": 10240, "d_kv": 64,
  "d_model": 4096, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1,
  "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
  "is_encoder_decoder": true, "is_gated_act": true, "layer_norm_epsilon": 1e-06,
  "model_type": "t5", "num_decoder_layers": 24, "num_heads": 64, "num_layers": 24,
  "output_past": true, "pad_token_id": 0, "relative_attention_max_distance": 128,
  "relative_attention_num_buckets": 32, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.41.2", "use_cache": true, "vocab_size": 32128})";
const char* kFluxVae = R"({
  "_class_name": "AutoencoderKL", "_diffusers_version": "0.30.0.dev0", "act_fn": "silu",
  "block_out_channels": [128, 256, 512, 512],
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",
                       "DownEncoderBlock2D"],
  "force_upcast": true, "in_channels": 3, "latent_channels": 16, "latents_mean": null,
  "latents_std": null, "layers_per_block": 2, "mid_block_add_attention": true,
  "norm_num_groups": 32, "out_channels": 3, "sample_size": 1024, "scaling_factor": 0.3611,
  "shift_factor": 0.1159,
  "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
                     "UpDecoderBlock2D"],
  "use_post_quant_conv": false, "use_quant_conv": false})";
const char* kSchnellScheduler = R"({
  "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
  "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
  "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": false})";
const char* kSchnellIndex = R"({
  "_class_name": "FluxPipeline", "_diffusers_version": "0.30.0.dev0",
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "CLIPTextModel"],
  "text_encoder_2": ["transformers", "T5EncoderModel"],
  "tokenizer": ["transformers", "CLIPTokenizer"],
  "tokenizer_2": ["transformers", "T5TokenizerFast"],
  "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]})";

// stabilityai/stable-diffusion-3.5-medium and -large as published (diffusers folders): the
// transformers differ; the CLIP-L / CLIP-G (with projection), T5-XXL, VAE and scheduler configs
// are shared.
const char* kSd35MediumTransformer = R"({
  "_class_name": "SD3Transformer2DModel", "_diffusers_version": "0.31.0.dev0",
  "attention_head_dim": 64, "caption_projection_dim": 1536,
  "dual_attention_layers": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], "in_channels": 16,
  "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 24, "out_channels": 16,
  "patch_size": 2, "pooled_projection_dim": 2048, "pos_embed_max_size": 384,
  "qk_norm": "rms_norm", "sample_size": 128})";
const char* kSd35LargeTransformer = R"({
  "_class_name": "SD3Transformer2DModel", "_diffusers_version": "0.31.0.dev0",
  "attention_head_dim": 64, "caption_projection_dim": 2432, "dual_attention_layers": [],
  "in_channels": 16, "joint_attention_dim": 4096, "num_attention_heads": 38, "num_layers": 38,
  "out_channels": 16, "patch_size": 2, "pooled_projection_dim": 2048, "pos_embed_max_size": 192,
  "qk_norm": "rms_norm", "sample_size": 128})";
const char* kSd3ClipL = R"({
  "architectures": ["CLIPTextModelWithProjection"], "attention_dropout": 0.0, "bos_token_id": 0,
  "dropout": 0.0, "eos_token_id": 2, "hidden_act": "quick_gelu", "hidden_size": 768,
  "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 3072,
  "layer_norm_eps": 1e-05, "max_position_embeddings": 77, "model_type": "clip_text_model",
  "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "projection_dim": 768,
  "torch_dtype": "float16", "transformers_version": "4.45.2", "vocab_size": 49408})";
const char* kSd3ClipG = R"({
  "architectures": ["CLIPTextModelWithProjection"], "attention_dropout": 0.0, "bos_token_id": 0,
  "dropout": 0.0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_size": 1280,
  "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 5120,
  "layer_norm_eps": 1e-05, "max_position_embeddings": 77, "model_type": "clip_text_model",
  "num_attention_heads": 20, "num_hidden_layers": 32, "pad_token_id": 1, "projection_dim": 1280,
  "torch_dtype": "float16", "transformers_version": "4.45.2", "vocab_size": 49408})";
const char* kSd3Vae = R"({
  "_class_name": "AutoencoderKL", "_diffusers_version": "0.31.0.dev0", "act_fn": "silu",
  "block_out_channels": [128, 256, 512, 512],
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",
                       "DownEncoderBlock2D"],
  "force_upcast": true, "in_channels": 3, "latent_channels": 16, "latents_mean": null,
  "latents_std": null, "layers_per_block": 2, "mid_block_add_attention": true,
  "norm_num_groups": 32, "out_channels": 3, "sample_size": 1024, "scaling_factor": 1.5305,
  "shift_factor": 0.0609,
  "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
                     "UpDecoderBlock2D"],
  "use_post_quant_conv": false, "use_quant_conv": false})";
const char* kSd3Scheduler = R"({
  "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.31.0.dev0",
  "num_train_timesteps": 1000, "shift": 3.0})";
const char* kSd3Index = R"({
  "_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.31.0.dev0",
  "feature_extractor": [null, null], "image_encoder": [null, null],
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
  "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
  "text_encoder_3": ["transformers", "T5EncoderModel"],
  "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
  "tokenizer_3": ["transformers", "T5TokenizerFast"],
  "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]})";
// black-forest-labs/FLUX.2-dev as published (diffusers folder): the transformer, the
// Mistral Small 3.2 text encoder (Mistral3ForConditionalGeneration; only its language model's
// weights are written, the vision tower is never loaded), the Flux2 VAE and the scheduler.
const char* kFlux2Transformer = R"({
  "_class_name": "Flux2Transformer2DModel", "_diffusers_version": "0.36.0.dev0",
  "attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32], "eps": 1e-06,
  "guidance_embeds": true, "in_channels": 128, "joint_attention_dim": 15360, "mlp_ratio": 3.0,
  "num_attention_heads": 48, "num_layers": 8, "num_single_layers": 48, "out_channels": null,
  "patch_size": 1, "rope_theta": 2000, "timestep_guidance_channels": 256})";
const char* kMistralSmall32 = R"({
  "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
  "model_type": "mistral3", "multimodal_projector_bias": false, "projector_hidden_act": "gelu",
  "spatial_merge_size": 2,
  "text_config": {
    "attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "initializer_range": 0.02, "intermediate_size": 32768, "max_position_embeddings": 131072,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
    "sliding_window": null, "use_cache": true, "vocab_size": 131072},
  "torch_dtype": "bfloat16", "transformers_version": "4.57.0",
  "vision_config": {
    "attention_dropout": 0.0, "head_dim": 64, "hidden_act": "silu", "hidden_size": 1024,
    "image_size": 1540, "initializer_range": 0.02, "intermediate_size": 4096,
    "model_type": "pixtral", "num_attention_heads": 16, "num_channels": 3,
    "num_hidden_layers": 24, "patch_size": 14, "rope_theta": 10000.0},
  "vision_feature_layer": -1})";
const char* kFlux2Vae = R"({
  "_class_name": "AutoencoderKLFlux2", "_diffusers_version": "0.36.0.dev0", "act_fn": "silu",
  "batch_norm_eps": 0.0001, "batch_norm_momentum": 0.1, "block_out_channels": [128, 256, 512, 512],
  "decoder_block_out_channels": null,
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",
                       "DownEncoderBlock2D"],
  "force_upcast": true, "in_channels": 3, "latent_channels": 32, "layers_per_block": 2,
  "mid_block_add_attention": true, "norm_num_groups": 32, "out_channels": 3,
  "patch_size": [2, 2], "sample_size": 1024,
  "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
                     "UpDecoderBlock2D"],
  "use_post_quant_conv": true, "use_quant_conv": true})";
const char* kFlux2Index = R"({
  "_class_name": "Flux2Pipeline", "_diffusers_version": "0.36.0.dev0",
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "Mistral3ForConditionalGeneration"],
  "tokenizer": ["transformers", "PixtralProcessor"],
  "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": ["diffusers", "AutoencoderKLFlux2"]})";

struct TensorSpec {
  std::string name;
  Shape shape;
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even (no NaNs are generated)
  return uint16_t(u >> 16);
}

// Norm scales 1, biases 0, everything else uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)): activations
// stay finite through every layer, so the run exercises real arithmetic.
void fill(const TensorSpec& t, uint64_t seed, std::vector<uint16_t>& out, size_t begin) {
  const bool vector = t.shape.size() == 1;
  const bool norm =
      t.name.find("norm") != std::string::npos || t.name.find("layer_norm") != std::string::npos;
  const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
  if (vector && (norm || bias || t.name.find("running") != std::string::npos)) {
    const float v = bias ? 0.f : 1.f;
    std::fill(out.begin(), out.end(), to_bf16(v));
    return;
  }
  const int64_t numel = shape_numel(t.shape);
  const double fan_in = t.shape.empty() ? 1.0 : double(numel / std::max<int64_t>(1, t.shape[0]));
  const float a = float(1.0 / std::sqrt(std::max(1.0, fan_in)));
  uint64_t s = seed ^ name_hash(t.name) ^ (uint64_t(begin) * 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < out.size(); i += 2) {
    const uint64_t r = splitmix(s);
    const float u0 = float(uint32_t(r) >> 8) * (1.f / 16777216.f);
    const float u1 = float(uint32_t(r >> 32) >> 8) * (1.f / 16777216.f);
    out[i] = to_bf16((2.f * u0 - 1.f) * a);
    if (i + 1 < out.size()) out[i + 1] = to_bf16((2.f * u1 - 1.f) * a);
  }
}

// One safetensors file: header, then each tensor generated in chunks and written.
void write_shard(const fs::path& path, std::vector<TensorSpec> tensors, uint64_t seed) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = size_t(shape_numel(t.shape)) * 2;
    header[t.name] = {
        {"dtype", "BF16"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  const fs::path tmp = path.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TESSERA_CHECK(f, "[make_synthetic_checkpoint] cannot write ", tmp.string());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  bool ok =
      std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  constexpr size_t kChunk = size_t(1) << 22;  // elements per chunk (8 MiB)
  std::vector<uint16_t> buf;
  for (const auto& t : tensors) {
    const size_t numel = size_t(shape_numel(t.shape));
    for (size_t b = 0; b < numel && ok; b += kChunk) {
      buf.resize(std::min(kChunk, numel - b));
      fill(t, seed, buf, b);
      ok = std::fwrite(buf.data(), 2, buf.size(), f) == buf.size();
    }
  }
  ok = std::fclose(f) == 0 && ok;
  TESSERA_CHECK(ok, "[make_synthetic_checkpoint] writing ", tmp.string(), " failed (disk full?)");
  fs::rename(tmp, path);
}

// Shards like the published checkpoints: in model order, a new shard when one would pass
// `max_shard_bytes`; names <stem>-0000i-of-0000N.safetensors plus the index.
void write_checkpoint(const fs::path& dir, const std::string& stem, const Module& model,
                      size_t max_shard_bytes, uint64_t seed) {
  std::vector<std::vector<TensorSpec>> shards(1);
  size_t in_shard = 0, total = 0;
  for (const auto& p : model.named_parameters()) {
    // T5's embed_tokens is a tied copy of shared.weight, which transformers does not save.
    if (p.optional && p.name != "shared.weight") continue;
    const size_t bytes = size_t(shape_numel(p.shape)) * 2;
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back({p.name, p.shape});
    in_shard += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    write_shard(dir / (stem + ".safetensors"), shards[0], seed);
    std::fprintf(stderr, "  %s: %.2f GB\n", (dir / (stem + ".safetensors")).c_str(), total / 1e9);
    return;
  }
  json weight_map = json::object();
  char name[128];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof name, "%s-%05zu-of-%05zu.safetensors", stem.c_str(), i + 1,
                  shards.size());
    for (const auto& t : shards[i]) weight_map[t.name] = name;
    write_shard(dir / name, shards[i], seed);
    std::fprintf(stderr, "  %s\n", (dir / name).c_str());
  }
  std::ofstream(dir / (stem + ".safetensors.index.json"))
      << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) << "\n";
  std::fprintf(stderr, "  %s: %.2f GB in %zu shards\n", dir.c_str(), total / 1e9, shards.size());
}

fs::path write_config(const fs::path& dir, const std::string& file, const char* text) {
  fs::create_directories(dir);
  std::ofstream(dir / file) << json::parse(text).dump(2) << "\n";
  return dir / file;
}

void copy_folder(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))  // follows the fixtures' symlinks
    fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing);
}

// Layer counts below the published ones keep the full width on a smaller disk (0: published).
struct Flux2Sizes {
  int64_t text_encoder_layers = 0, double_blocks = 0, single_blocks = 0;
};

int make_flux1_schnell(const fs::path& out, uint64_t seed, const std::vector<std::string>& only,
                       const Flux2Sizes& sizes) {
  auto want = [&](const std::string& c) {
    return only.empty() || std::find(only.begin(), only.end(), c) != only.end();
  };
  fs::create_directories(out);
  std::ofstream(out / "model_index.json") << json::parse(kSchnellIndex).dump(2) << "\n";
  write_config(out / "scheduler", "scheduler_config.json", kSchnellScheduler);
  const fs::path tiny = fs::path(TESSERA_SOURCE_DIR) / "tests/fixtures/flux1-schnell-tiny";
  copy_folder(tiny / "tokenizer", out / "tokenizer");
  copy_folder(tiny / "tokenizer_2", out / "tokenizer_2");
  constexpr size_t kGB = size_t(1000) * 1000 * 1000;
  if (want("text_encoder")) {
    const auto cfg = write_config(out / "text_encoder", "config.json", kClipL);
    const CLIPTextModel m(CLIPTextConfig::from_json(JsonConfig::load(cfg.string()), false));
    write_checkpoint(out / "text_encoder", "model", m, 5 * kGB, seed);
  }
  if (want("text_encoder_2")) {  // transformers' 5 GB shards
    const auto cfg = write_config(out / "text_encoder_2", "config.json", kT5Xxl);
    const T5EncoderModel m(T5Config::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "text_encoder_2", "model", m, 5 * kGB, seed + 1);
  }
  if (want("transformer")) {  // diffusers' 10 GB shards
    json tcfg = json::parse(kSchnellTransformer);
    if (sizes.double_blocks > 0) tcfg["num_layers"] = sizes.double_blocks;  // flux-mini: 2, 4
    if (sizes.single_blocks > 0) tcfg["num_single_layers"] = sizes.single_blocks;
    const auto cfg = write_config(out / "transformer", "config.json", tcfg.dump().c_str());
    const FluxTransformer2DModel m(
        FluxTransformerConfig::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "transformer", "diffusion_pytorch_model", m, 10 * kGB, seed + 2);
  }
  if (want("vae")) {
    const auto cfg = write_config(out / "vae", "config.json", kFluxVae);
    const AutoencoderKL m(AutoencoderKLConfig::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "vae", "diffusion_pytorch_model", m, 10 * kGB, seed + 3);
  }
  return 0;
}

// SD3.5-medium or -large: the published configs, the tiny fixture's tokenizers (real CLIP
// vocabulary; T5's ids stay below T5-XXL's), seeded weights. The transformer's position table
// (an optional buffer) is left out: tessera computes it, as diffusers does at construction.
int make_sd35(const fs::path& out, bool large, uint64_t seed,
              const std::vector<std::string>& only) {
  auto want = [&](const std::string& c) {
    return only.empty() || std::find(only.begin(), only.end(), c) != only.end();
  };
  fs::create_directories(out);
  std::ofstream(out / "model_index.json") << json::parse(kSd3Index).dump(2) << "\n";
  write_config(out / "scheduler", "scheduler_config.json", kSd3Scheduler);
  const fs::path tiny = fs::path(TESSERA_SOURCE_DIR) / "tests/fixtures/sd35-medium-tiny";
  for (const char* t : {"tokenizer", "tokenizer_2", "tokenizer_3"}) copy_folder(tiny / t, out / t);
  constexpr size_t kGB = size_t(1000) * 1000 * 1000;
  const char* clip[] = {kSd3ClipL, kSd3ClipG};
  for (int i = 0; i < 2; ++i) {
    const std::string name = i == 0 ? "text_encoder" : "text_encoder_2";
    if (!want(name)) continue;
    const auto cfg = write_config(out / name, "config.json", clip[i]);
    const CLIPTextModelWithProjection m(
        CLIPTextConfig::from_json(JsonConfig::load(cfg.string()), true));
    write_checkpoint(out / name, "model", m, 5 * kGB, seed + uint64_t(i));
  }
  if (want("text_encoder_3")) {
    const auto cfg = write_config(out / "text_encoder_3", "config.json", kT5Xxl);
    const T5EncoderModel m(T5Config::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "text_encoder_3", "model", m, 5 * kGB, seed + 2);
  }
  if (want("transformer")) {
    const auto cfg = write_config(out / "transformer", "config.json",
                                  large ? kSd35LargeTransformer : kSd35MediumTransformer);
    const SD3Transformer2DModel m(SD3TransformerConfig::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "transformer", "diffusion_pytorch_model", m, 10 * kGB, seed + 3);
  }
  if (want("vae")) {
    const auto cfg = write_config(out / "vae", "config.json", kSd3Vae);
    const AutoencoderKL m(AutoencoderKLConfig::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "vae", "diffusion_pytorch_model", m, 10 * kGB, seed + 4);
  }
  return 0;
}

int make_flux2_dev(const fs::path& out, uint64_t seed, const std::vector<std::string>& only,
                   const Flux2Sizes& sizes) {
  auto want = [&](const std::string& c) {
    return only.empty() || std::find(only.begin(), only.end(), c) != only.end();
  };
  fs::create_directories(out);
  std::ofstream(out / "model_index.json") << json::parse(kFlux2Index).dump(2) << "\n";
  const fs::path tiny = fs::path(TESSERA_SOURCE_DIR) / "tests/fixtures/flux2-dev-tiny";
  copy_folder(tiny / "scheduler", out / "scheduler");
  copy_folder(tiny / "tokenizer", out / "tokenizer");  // the tiny vocabulary's ids all exist
  constexpr size_t kGB = size_t(1000) * 1000 * 1000;
  if (want("text_encoder")) {
    json cfg = json::parse(kMistralSmall32);
    if (sizes.text_encoder_layers > 0)
      cfg["text_config"]["num_hidden_layers"] = sizes.text_encoder_layers;
    const auto path = write_config(out / "text_encoder", "config.json", cfg.dump().c_str());
    const Mistral3TextModel m(Mistral3TextConfig::from_json(JsonConfig::load(path.string())));
    write_checkpoint(out / "text_encoder", "model", m, 5 * kGB, seed);
  }
  if (want("transformer")) {
    json cfg = json::parse(kFlux2Transformer);
    if (sizes.double_blocks > 0) cfg["num_layers"] = sizes.double_blocks;
    if (sizes.single_blocks > 0) cfg["num_single_layers"] = sizes.single_blocks;
    const auto path = write_config(out / "transformer", "config.json", cfg.dump().c_str());
    const Flux2Transformer2DModel m(
        Flux2TransformerConfig::from_json(JsonConfig::load(path.string())));
    write_checkpoint(out / "transformer", "diffusion_pytorch_model", m, 10 * kGB, seed + 2);
  }
  if (want("vae")) {
    const auto cfg = write_config(out / "vae", "config.json", kFlux2Vae);
    const AutoencoderKL m(AutoencoderKLConfig::from_json(JsonConfig::load(cfg.string())));
    write_checkpoint(out / "vae", "diffusion_pytorch_model", m, 10 * kGB, seed + 3);
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app{
      "Writes a diffusers folder with the published configs and seeded random bf16 "
      "weights of the real sizes"};
  std::string model = "flux1-schnell", output;
  uint64_t seed = 0;
  std::vector<std::string> only;
  app.add_option("--model", model,
                 "which pipeline (flux1-schnell, sd35-medium, sd35-large, flux2-dev)")
      ->check(CLI::IsMember({"flux1-schnell", "sd35-medium", "sd35-large", "flux2-dev"}));
  tessera::Flux2Sizes sizes;
  app.add_option("--text-encoder-layers", sizes.text_encoder_layers,
                 "flux2-dev: Mistral3 layers to write (default: the published 40)")
      ->check(CLI::PositiveNumber);
  app.add_option("--double-blocks", sizes.double_blocks,
                 "flux2-dev, flux1-schnell: double-stream blocks (default: the published 8, 19)")
      ->check(CLI::PositiveNumber);
  app.add_option("--single-blocks", sizes.single_blocks,
                 "flux2-dev, flux1-schnell: single-stream blocks (default: the published 48, 38)")
      ->check(CLI::PositiveNumber);
  app.add_option("--output,-o", output, "folder to write (created)")->required();
  app.add_option("--seed", seed, "seed of the random weights");
  app.add_option("--components", only,
                 "only these (text_encoder text_encoder_2 [text_encoder_3] transformer vae); "
                 "configs always")
      ->check(CLI::IsMember(
          {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"}));
  CLI11_PARSE(app, argc, argv);
  try {
    std::fprintf(stderr, "make_synthetic_checkpoint: %s -> %s\n", model.c_str(), output.c_str());
    if (model == "sd35-medium" || model == "sd35-large")
      return tessera::make_sd35(output, model == "sd35-large", seed, only);
    if (model == "flux2-dev") {
      for (const auto& c : only)
        if (c == "text_encoder_2") throw std::runtime_error("flux2-dev has no text_encoder_2");
      return tessera::make_flux2_dev(output, seed, only, sizes);
    }
    return tessera::make_flux1_schnell(output, seed, only, sizes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_synthetic_checkpoint: error: %s\n", e.what());
    return 1;
  }
}
