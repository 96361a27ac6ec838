#include "models/vae_blocks.h"

#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/copy.h"
#include "ops/linalg.h"
#include "ops/resample.h"
#include "runtime/error.h"

namespace tessera::vae {

namespace {

void record(Capture* capture, const std::string& name, const Tensor& t) {
  if (capture) (*capture)[name] = t;
}

}  // namespace

// ---- ResnetBlock2D -------------------------------------------------------------------------

ResnetBlock2D::ResnetBlock2D(int64_t in_ch, int64_t out_ch, int64_t groups, double eps, UnaryOp a)
    : act(a),
      norm1(groups, in_ch, eps),
      conv1(in_ch, out_ch, 3, 1, 1),
      norm2(groups, out_ch, eps),
      conv2(out_ch, out_ch, 3, 1, 1) {
  register_module("norm1", &norm1);
  register_module("conv1", &conv1);
  register_module("norm2", &norm2);
  register_module("conv2", &conv2);
  if (in_ch != out_ch) {
    conv_shortcut = std::make_unique<nn::Conv2d>(in_ch, out_ch, 1, 1, 0);
    register_module("conv_shortcut", conv_shortcut.get());
  }
}

Tensor ResnetBlock2D::forward(const Tensor& x) const {
  Tensor h = conv1(unary(act, norm1(x)));
  h = conv2(unary(act, norm2(h)));  // dropout is the identity at inference
  // output_scale_factor is 1 in every VAE block, so the division diffusers does is exact.
  return add(conv_shortcut ? (*conv_shortcut)(x) : x, h);
}

// ---- SpatialSelfAttention ------------------------------------------------------------------

SpatialSelfAttention::SpatialSelfAttention(int64_t c, int64_t groups, double eps)
    : channels(c), group_norm(groups, c, eps), to_q(c, c), to_k(c, c), to_v(c, c) {
  register_module("group_norm", &group_norm);
  register_module("to_q", &to_q);
  register_module("to_k", &to_k);
  register_module("to_v", &to_v);
  to_out.push_back(std::make_unique<nn::Linear>(c, c));
  register_modules("to_out", to_out);
}

Tensor SpatialSelfAttention::forward(const Tensor& x) const {
  TESSERA_CHECK(x.ndim() == 4 && x.dim(1) == channels, "[vae attention] expected (B, ", channels,
                ", H, W), got ", x.describe());
  const int64_t B = x.dim(0), C = channels, H = x.dim(2), W = x.dim(3);
  // (B, C, H, W) -> tokens (B, H*W, C) as a transposed view.
  Tensor tokens = group_norm(x).view({B, C, H * W}).transpose(1, 2);
  // torch's F.linear fuses the bias only for contiguous 3-D input; on transposed tokens it runs
  // matmul, rounds, then adds the bias (a second bf16 rounding), so do the same.
  const bool fused_bias = tokens.is_contiguous();
  // For B > 1 one copy serves all three projections (linear would copy for each).
  if (B > 1) tokens = contiguous(tokens);
  auto project = [&](const nn::Linear& l) {
    const Tensor y = fused_bias ? l(tokens) : add(linear(tokens, l.weight), l.bias);
    return y.unsqueeze(1);  // one head: (B, 1, H*W, C)
  };
  const Tensor q = project(to_q), k = project(to_k), v = project(to_v);
  const Tensor o = (*to_out[0])(scaled_dot_product_attention(q, k, v).squeeze(1));
  // Back to (B, C, H, W) as a view; the residual add writes the contiguous result.
  return add(o.transpose(1, 2).view({B, C, H, W}), x);
}

// ---- UNetMidBlock2D ------------------------------------------------------------------------

UNetMidBlock2D::UNetMidBlock2D(int64_t c, int64_t groups, double eps, UnaryOp act,
                               bool add_attention) {
  if (add_attention) attentions.push_back(std::make_unique<SpatialSelfAttention>(c, groups, eps));
  for (int i = 0; i < 2; ++i)
    resnets.push_back(std::make_unique<ResnetBlock2D>(c, c, groups, eps, act));
  register_modules("attentions", attentions);
  register_modules("resnets", resnets);
}

Tensor UNetMidBlock2D::forward(const Tensor& x, const std::string& path, Capture* capture) const {
  Tensor h = resnets[0]->forward(x);
  record(capture, path + ".resnets.0", h);
  if (!attentions.empty()) {
    h = attentions[0]->forward(h);
    record(capture, path + ".attentions.0", h);
  }
  h = resnets[1]->forward(h);
  record(capture, path + ".resnets.1", h);
  record(capture, path, h);
  return h;
}

// ---- Downsample2D / Upsample2D -------------------------------------------------------------

Downsample2D::Downsample2D(int64_t c) : conv(c, c, 3, 2, 0) {
  register_module("conv", &conv);
}

Tensor Downsample2D::forward(const Tensor& x) const {
  // F.pad(x, (0, 1, 0, 1)) then conv with padding 0 is the same as asymmetric conv padding.
  Conv2dParams p;
  p.stride = {2, 2};
  p.padding = {0, 1, 0, 1};  // top, bottom, left, right
  return conv.forward(x, p);
}

Upsample2D::Upsample2D(int64_t c) : conv(c, c, 3, 1, 1) {
  register_module("conv", &conv);
}

Tensor Upsample2D::forward(const Tensor& x) const {
  return conv(upsample_nearest(x, 2));
}

// ---- Down / up blocks ----------------------------------------------------------------------

DownEncoderBlock2D::DownEncoderBlock2D(int64_t in_ch, int64_t out_ch, int64_t num_layers,
                                       bool add_downsample, int64_t groups, double eps,
                                       UnaryOp act) {
  for (int64_t i = 0; i < num_layers; ++i)
    resnets.push_back(
        std::make_unique<ResnetBlock2D>(i == 0 ? in_ch : out_ch, out_ch, groups, eps, act));
  if (add_downsample) downsamplers.push_back(std::make_unique<Downsample2D>(out_ch));
  register_modules("resnets", resnets);
  register_modules("downsamplers", downsamplers);
}

Tensor DownEncoderBlock2D::forward(const Tensor& x) const {
  Tensor h = x;
  for (const auto& r : resnets) h = r->forward(h);
  for (const auto& d : downsamplers) h = d->forward(h);
  return h;
}

UpDecoderBlock2D::UpDecoderBlock2D(int64_t in_ch, int64_t out_ch, int64_t num_layers,
                                   bool add_upsample, int64_t groups, double eps, UnaryOp act) {
  for (int64_t i = 0; i < num_layers; ++i)
    resnets.push_back(
        std::make_unique<ResnetBlock2D>(i == 0 ? in_ch : out_ch, out_ch, groups, eps, act));
  if (add_upsample) upsamplers.push_back(std::make_unique<Upsample2D>(out_ch));
  register_modules("resnets", resnets);
  register_modules("upsamplers", upsamplers);
}

Tensor UpDecoderBlock2D::forward(const Tensor& x) const {
  Tensor h = x;
  for (const auto& r : resnets) h = r->forward(h);
  for (const auto& u : upsamplers) h = u->forward(h);
  return h;
}

// ---- Encoder / Decoder ---------------------------------------------------------------------

namespace {
constexpr double kEps = 1e-6;  // every VAE norm (resnet_eps, conv_norm_out, attention)
}  // namespace

Encoder::Encoder(const CoderShape& s)
    : act(s.act),
      conv_in(s.in_channels, s.block_out_channels.front(), 3, 1, 1),
      mid_block(s.block_out_channels.back(), s.norm_num_groups, kEps, s.act,
                s.mid_block_add_attention),
      conv_norm_out(s.norm_num_groups, s.block_out_channels.back(), kEps),
      conv_out(s.block_out_channels.back(), 2 * s.out_channels, 3, 1, 1) {
  const size_t n = s.block_out_channels.size();
  int64_t out_ch = s.block_out_channels.front();
  for (size_t i = 0; i < n; ++i) {
    const int64_t in_ch = out_ch;
    out_ch = s.block_out_channels[i];
    down_blocks.push_back(std::make_unique<DownEncoderBlock2D>(
        in_ch, out_ch, s.layers_per_block, i + 1 < n, s.norm_num_groups, kEps, s.act));
  }
  register_module("conv_in", &conv_in);
  register_modules("down_blocks", down_blocks);
  register_module("mid_block", &mid_block);
  register_module("conv_norm_out", &conv_norm_out);
  register_module("conv_out", &conv_out);
}

Tensor Encoder::forward(const Tensor& sample, const std::string& path, Capture* capture) const {
  Tensor h = conv_in(sample);
  record(capture, path + ".conv_in", h);
  for (size_t i = 0; i < down_blocks.size(); ++i) {
    h = down_blocks[i]->forward(h);
    record(capture, path + ".down_blocks." + std::to_string(i), h);
  }
  h = mid_block.forward(h, path + ".mid_block", capture);
  h = conv_norm_out(h);
  record(capture, path + ".conv_norm_out", h);
  h = conv_out(unary(act, h));
  record(capture, path + ".conv_out", h);
  return h;
}

Decoder::Decoder(const CoderShape& s)
    : act(s.act),
      conv_in(s.in_channels, s.block_out_channels.back(), 3, 1, 1),
      mid_block(s.block_out_channels.back(), s.norm_num_groups, kEps, s.act,
                s.mid_block_add_attention),
      conv_norm_out(s.norm_num_groups, s.block_out_channels.front(), kEps),
      conv_out(s.block_out_channels.front(), s.out_channels, 3, 1, 1) {
  const size_t n = s.block_out_channels.size();
  int64_t out_ch = s.block_out_channels.back();
  for (size_t i = 0; i < n; ++i) {
    const int64_t in_ch = out_ch;
    out_ch = s.block_out_channels[n - 1 - i];
    up_blocks.push_back(std::make_unique<UpDecoderBlock2D>(
        in_ch, out_ch, s.layers_per_block + 1, i + 1 < n, s.norm_num_groups, kEps, s.act));
  }
  register_module("conv_in", &conv_in);
  register_module("mid_block", &mid_block);
  register_modules("up_blocks", up_blocks);
  register_module("conv_norm_out", &conv_norm_out);
  register_module("conv_out", &conv_out);
}

Tensor Decoder::forward(const Tensor& z, const std::string& path, Capture* capture) const {
  Tensor h = conv_in(z);
  record(capture, path + ".conv_in", h);
  h = mid_block.forward(h, path + ".mid_block", capture);
  for (size_t i = 0; i < up_blocks.size(); ++i) {
    h = up_blocks[i]->forward(h);
    record(capture, path + ".up_blocks." + std::to_string(i), h);
  }
  h = conv_norm_out(h);
  record(capture, path + ".conv_norm_out", h);
  h = conv_out(unary(act, h));
  record(capture, path + ".conv_out", h);
  return h;
}

}  // namespace tessera::vae
