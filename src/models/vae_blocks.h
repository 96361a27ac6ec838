// The building blocks of diffusers' AutoencoderKL (models/autoencoders/vae.py Encoder/Decoder,
// resnet.py ResnetBlock2D, unets/unet_2d_blocks.py UNetMidBlock2D / DownEncoderBlock2D /
// UpDecoderBlock2D, downsampling.py / upsampling.py), with the same module and parameter names.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "ops/elementwise.h"

namespace tessera::vae {

// Where a block records its output: `capture` may be null; names are full module paths.
using Capture = std::map<std::string, Tensor>;

// ResnetBlock2D without a time embedding (temb_channels=None, output_scale_factor 1):
// norm1, act, conv1, norm2, act, (dropout), conv2, plus the input (through a 1x1 conv_shortcut
// when the channel count changes).
class ResnetBlock2D : public Module {
 public:
  ResnetBlock2D(int64_t in_channels, int64_t out_channels, int64_t groups, double eps, UnaryOp act);
  Tensor forward(const Tensor& x) const;
  UnaryOp act;
  nn::GroupNorm norm1;
  nn::Conv2d conv1;
  nn::GroupNorm norm2;
  nn::Conv2d conv2;
  std::unique_ptr<nn::Conv2d> conv_shortcut;  // only when in_channels != out_channels
};

// diffusers Attention as the VAE mid-block builds it (_from_deprecated_attn_block): group_norm,
// then to_q/to_k/to_v over the H*W tokens, one head of dim C, to_out.0, plus the input.
class SpatialSelfAttention : public Module {
 public:
  SpatialSelfAttention(int64_t channels, int64_t groups, double eps);
  Tensor forward(const Tensor& x) const;
  int64_t channels;
  nn::GroupNorm group_norm;
  nn::Linear to_q, to_k, to_v;
  std::vector<std::unique_ptr<nn::Linear>> to_out;  // "to_out.0" (to_out.1 is dropout)
};

// UNetMidBlock2D with num_layers=1: resnets.0, [attentions.0], resnets.1.
class UNetMidBlock2D : public Module {
 public:
  UNetMidBlock2D(int64_t channels, int64_t groups, double eps, UnaryOp act, bool add_attention);
  Tensor forward(const Tensor& x, const std::string& path, Capture* capture) const;
  std::vector<std::unique_ptr<SpatialSelfAttention>> attentions;  // empty without attention
  std::vector<std::unique_ptr<ResnetBlock2D>> resnets;
};

// Downsample2D(use_conv=True, padding=0): zero pad (0, 1, 0, 1), then a 3x3 stride-2 conv.
class Downsample2D : public Module {
 public:
  explicit Downsample2D(int64_t channels);
  Tensor forward(const Tensor& x) const;
  nn::Conv2d conv;
};

// Upsample2D(use_conv=True): nearest 2x, then a 3x3 conv.
class Upsample2D : public Module {
 public:
  explicit Upsample2D(int64_t channels);
  Tensor forward(const Tensor& x) const;
  nn::Conv2d conv;
};

class DownEncoderBlock2D : public Module {
 public:
  DownEncoderBlock2D(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                     bool add_downsample, int64_t groups, double eps, UnaryOp act);
  Tensor forward(const Tensor& x) const;
  std::vector<std::unique_ptr<ResnetBlock2D>> resnets;
  std::vector<std::unique_ptr<Downsample2D>> downsamplers;  // empty in the last block
};

class UpDecoderBlock2D : public Module {
 public:
  UpDecoderBlock2D(int64_t in_channels, int64_t out_channels, int64_t num_layers, bool add_upsample,
                   int64_t groups, double eps, UnaryOp act);
  Tensor forward(const Tensor& x) const;
  std::vector<std::unique_ptr<ResnetBlock2D>> resnets;
  std::vector<std::unique_ptr<Upsample2D>> upsamplers;  // empty in the last block
};

struct CoderShape {
  int64_t in_channels, out_channels;
  std::vector<int64_t> block_out_channels;
  int64_t layers_per_block, norm_num_groups;
  UnaryOp act;
  bool mid_block_add_attention;
};

// vae.py Encoder with double_z: conv_in, down blocks, mid block, conv_norm_out, act, conv_out to
// 2 * out_channels. Records <path>.conv_in, .down_blocks.N, .mid_block (and its sub-blocks),
// .conv_norm_out and .conv_out.
class Encoder : public Module {
 public:
  explicit Encoder(const CoderShape& s);
  Tensor forward(const Tensor& sample, const std::string& path, Capture* capture) const;
  UnaryOp act;
  nn::Conv2d conv_in;
  std::vector<std::unique_ptr<DownEncoderBlock2D>> down_blocks;
  UNetMidBlock2D mid_block;
  nn::GroupNorm conv_norm_out;
  nn::Conv2d conv_out;
};

// vae.py Decoder (norm_type "group"): conv_in, mid block, up blocks of layers_per_block + 1
// resnets over the reversed channels, conv_norm_out, act, conv_out. Records <path>.conv_in,
// .mid_block, .up_blocks.N, .conv_norm_out and .conv_out.
class Decoder : public Module {
 public:
  explicit Decoder(const CoderShape& s);
  Tensor forward(const Tensor& z, const std::string& path, Capture* capture) const;
  UnaryOp act;
  nn::Conv2d conv_in;
  UNetMidBlock2D mid_block;
  std::vector<std::unique_ptr<UpDecoderBlock2D>> up_blocks;
  nn::GroupNorm conv_norm_out;
  nn::Conv2d conv_out;
};

}  // namespace tessera::vae
