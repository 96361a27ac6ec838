#include "models/autoencoder_kl.h"

#include <optional>
#include <sstream>

#include "nn/checkpoint_source.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera {

namespace {

std::string list_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// diffusers' get_activation names that tessera has an op for.
std::optional<UnaryOp> activation_op(const std::string& name) {
  if (name == "silu" || name == "swish") return UnaryOp::silu;
  if (name == "gelu") return UnaryOp::gelu;
  if (name == "relu") return UnaryOp::relu;
  return std::nullopt;
}

// A list of block type names: every entry must be `expected` and there must be one per block.
void check_block_types(const JsonConfig& c, const char* key, const char* expected, size_t blocks,
                       const char* channels_key) {
  std::vector<std::string> types{expected};  // diffusers' default: a single block
  if (c.has(key)) types = c.get_string_list(key);
  for (const auto& t : types)
    TESSERA_CHECK(t == expected, "[AutoencoderKL] unsupported value ", key, " entry '", t, "' in ",
                  c.source(), "; only ", expected, " is supported");
  TESSERA_CHECK(types.size() == blocks, "[AutoencoderKL] unsupported value: ", key, " has ",
                types.size(), " entries but ", channels_key, " has ", blocks, " in ", c.source());
}

void check_channels(const JsonConfig& c, const char* key, const std::vector<int64_t>& channels,
                    int64_t groups) {
  TESSERA_CHECK(!channels.empty(), "[AutoencoderKL] unsupported value ", key, "=[] in ", c.source(),
                "; expected at least one block");
  for (int64_t ch : channels) {
    TESSERA_CHECK(ch > 0, "[AutoencoderKL] unsupported value ", key, "=", list_str(channels),
                  " in ", c.source(), "; channel counts must be positive");
    TESSERA_CHECK(ch % groups == 0, "[AutoencoderKL] unsupported value norm_num_groups=", groups,
                  " in ", c.source(), ": it does not divide ", key, "=", list_str(channels));
  }
}

void require_positive(const JsonConfig& c, const char* key, int64_t v) {
  TESSERA_CHECK(v > 0, "[AutoencoderKL] unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

// Older checkpoints name the mid-block attention query/key/value/proj_attn; diffusers renames
// them to to_q/to_k/to_v/to_out.0 on load, and so does load_weights here.
constexpr const char* kOldAttentionNames[] = {".query.", ".key.", ".value.", ".proj_attn."};
constexpr const char* kNewAttentionNames[] = {".to_q.", ".to_k.", ".to_v.", ".to_out.0."};

// `name` with its first from[i] replaced by to[i], inside a mid-block attention only.
std::string renamed_attention(const std::string& name, const char* const* from,
                              const char* const* to) {
  const size_t at = name.find(".mid_block.attentions.");
  if (at == std::string::npos) return name;
  for (int i = 0; i < 4; ++i) {
    const size_t p = name.find(from[i], at);
    if (p != std::string::npos)
      return name.substr(0, p) + to[i] + name.substr(p + std::string(from[i]).size());
  }
  return name;
}

}  // namespace

AutoencoderKLConfig AutoencoderKLConfig::from_json(const JsonConfig& c) {
  AutoencoderKLConfig k;
  k.class_name = c.get_string("_class_name", k.class_name);
  TESSERA_CHECK(k.class_name == "AutoencoderKL" || k.class_name == "AutoencoderKLFlux2",
                "[AutoencoderKL] unsupported value _class_name='", k.class_name, "' in ",
                c.source(), "; expected AutoencoderKL or AutoencoderKLFlux2");
  k.in_channels = c.get_int("in_channels", k.in_channels);
  k.out_channels = c.get_int("out_channels", k.out_channels);
  k.block_out_channels = c.get_int_list("block_out_channels");
  k.layers_per_block = c.get_int("layers_per_block");
  k.latent_channels = c.get_int("latent_channels");
  k.norm_num_groups = c.get_int("norm_num_groups");
  k.act_fn = c.get_string("act_fn", k.act_fn);
  k.use_quant_conv = c.get_bool("use_quant_conv", k.use_quant_conv);
  k.use_post_quant_conv = c.get_bool("use_post_quant_conv", k.use_post_quant_conv);
  k.mid_block_add_attention = c.get_bool("mid_block_add_attention", k.mid_block_add_attention);
  k.force_upcast = c.get_bool("force_upcast", k.force_upcast);
  k.scaling_factor = c.get_float("scaling_factor", k.scaling_factor);
  if (c.has("shift_factor")) k.shift_factor = c.get_float("shift_factor");
  if (c.has("latents_mean")) k.latents_mean = c.get_float_list("latents_mean");
  if (c.has("latents_std")) k.latents_std = c.get_float_list("latents_std");

  k.decoder_block_out_channels = k.block_out_channels;
  if (k.is_flux2()) {
    if (c.has("decoder_block_out_channels"))
      k.decoder_block_out_channels = c.get_int_list("decoder_block_out_channels");
    k.batch_norm_eps = c.get_float("batch_norm_eps", k.batch_norm_eps);
    if (c.has("patch_size")) {
      const auto p = c.get_int_list("patch_size");
      TESSERA_CHECK(p.size() == 2 && p[0] > 0 && p[1] > 0,
                    "[AutoencoderKL] unsupported value patch_size=", list_str(p), " in ",
                    c.source(), "; expected two positive integers");
      k.patch_size = {p[0], p[1]};
    }
  }

  require_positive(c, "in_channels", k.in_channels);
  require_positive(c, "out_channels", k.out_channels);
  require_positive(c, "layers_per_block", k.layers_per_block);
  require_positive(c, "latent_channels", k.latent_channels);
  require_positive(c, "norm_num_groups", k.norm_num_groups);
  TESSERA_CHECK(activation_op(k.act_fn), "[AutoencoderKL] unsupported value act_fn='", k.act_fn,
                "' in ", c.source(), "; supported: silu, swish, gelu, relu");
  check_channels(c, "block_out_channels", k.block_out_channels, k.norm_num_groups);
  check_channels(c, "decoder_block_out_channels", k.decoder_block_out_channels, k.norm_num_groups);
  check_block_types(c, "down_block_types", "DownEncoderBlock2D", k.block_out_channels.size(),
                    "block_out_channels");
  check_block_types(c, "up_block_types", "UpDecoderBlock2D", k.decoder_block_out_channels.size(),
                    k.is_flux2() && c.has("decoder_block_out_channels")
                        ? "decoder_block_out_channels"
                        : "block_out_channels");
  // AutoencoderKL builds its Decoder with diffusers' default norm_type "group" only.
  return k;
}

namespace {

vae::CoderShape encoder_shape(const AutoencoderKLConfig& c) {
  TESSERA_CHECK(activation_op(c.act_fn), "[AutoencoderKL] unsupported act_fn '", c.act_fn, "'");
  return {c.in_channels,     c.latent_channels,        c.block_out_channels,     c.layers_per_block,
          c.norm_num_groups, *activation_op(c.act_fn), c.mid_block_add_attention};
}

vae::CoderShape decoder_shape(const AutoencoderKLConfig& c) {
  vae::CoderShape s = encoder_shape(c);
  s.in_channels = c.latent_channels;
  s.out_channels = c.out_channels;
  s.block_out_channels = c.decoder_block_out_channels;
  return s;
}

}  // namespace

AutoencoderKL::AutoencoderKL(const AutoencoderKLConfig& config)
    : encoder(encoder_shape(config)), decoder(decoder_shape(config)), config_(config) {
  register_module("encoder", &encoder);
  register_module("decoder", &decoder);
  const int64_t L = config.latent_channels;
  if (config.use_quant_conv) {
    quant_conv = std::make_unique<nn::Conv2d>(2 * L, 2 * L, 1);
    register_module("quant_conv", quant_conv.get());
  }
  if (config.use_post_quant_conv) {
    post_quant_conv = std::make_unique<nn::Conv2d>(L, L, 1);
    register_module("post_quant_conv", post_quant_conv.get());
  }
  if (config.is_flux2()) {
    const int64_t n = config.patch_size[0] * config.patch_size[1] * L;
    register_parameter("bn.running_mean", &bn_running_mean, {n});
    register_parameter("bn.running_var", &bn_running_var, {n});
  }
}

std::unique_ptr<WeightSource> AutoencoderKL::weight_source(
    const CheckpointWeightSource& checkpoint) {
  return std::make_unique<RenamedWeightSource>(
      checkpoint,
      [&checkpoint](const std::string& n) {
        return checkpoint.contains(n)
                   ? n
                   : renamed_attention(n, kNewAttentionNames, kOldAttentionNames);
      },
      [](const std::string& n) {
        return renamed_attention(n, kOldAttentionNames, kNewAttentionNames);
      });
}

bool AutoencoderKL::ignored_tensor(const std::string& name) {
  return name == "bn.num_batches_tracked";  // a training counter
}

int64_t AutoencoderKL::scale_factor() const {
  return int64_t(1) << (config_.block_out_channels.size() - 1);
}

Tensor AutoencoderKL::decode(const Tensor& z, std::map<std::string, Tensor>* capture) const {
  TESSERA_CHECK(z.ndim() == 4 && z.dim(1) == config_.latent_channels,
                "[AutoencoderKL.decode] expected z of shape (B, ", config_.latent_channels,
                ", h, w), got ", z.describe());
  TESSERA_CHECK(z.dtype() == dtype_, "[AutoencoderKL.decode] z is ", dtype_name(z.dtype()),
                " but the model is ", dtype_name(dtype_), "; convert it first");
  if (capture) return decode_eager(z, capture);  // activations need eager
  return call({z}, [&](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{decode_eager(x[0], nullptr)};
  })[0];
}

Tensor AutoencoderKL::decode_eager(const Tensor& z, std::map<std::string, Tensor>* capture) const {
  Tensor h = z;
  if (post_quant_conv) {
    h = (*post_quant_conv)(h);
    if (capture) (*capture)["post_quant_conv"] = h;
  }
  return decoder.forward(h, "decoder", capture);
}

DiagonalGaussianDistribution AutoencoderKL::encode(const Tensor& sample,
                                                   std::map<std::string, Tensor>* capture) const {
  TESSERA_CHECK(sample.ndim() == 4 && sample.dim(1) == config_.in_channels,
                "[AutoencoderKL.encode] expected sample of shape (B, ", config_.in_channels,
                ", H, W), got ", sample.describe());
  TESSERA_CHECK(sample.dtype() == dtype_, "[AutoencoderKL.encode] sample is ",
                dtype_name(sample.dtype()), " but the model is ", dtype_name(dtype_),
                "; convert it first");
  Tensor h = encoder.forward(sample, "encoder", capture);
  if (quant_conv) {
    h = (*quant_conv)(h);
    if (capture) (*capture)["quant_conv"] = h;
  }
  DiagonalGaussianDistribution d;
  d.parameters = h;
  const auto halves = chunk(h, 2, 1);
  d.mean = halves[0];
  d.logvar = minimum(maximum(halves[1], -30.0), 20.0);  // torch.clamp(logvar, -30, 20)
  d.std = exp(mul(d.logvar, 0.5));
  d.var = exp(d.logvar);
  return d;
}

Tensor DiagonalGaussianDistribution::sample(Generator& gen) const {
  return add(mean, mul(std, randn(mean.shape(), parameters.dtype(), gen)));
}

}  // namespace tessera
