// What every text-to-image pipeline shares: load options, the step callback, stage timings,
// and diffusers' VaeImageProcessor post-processing.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distributed/tensor_parallel.h"
#include "pipelines/offload.h"
#include "runtime/device.h"
#include "runtime/memory_stats.h"
#include "runtime/tensor.h"

namespace tessera {

struct PipelineLoadOptions {
  DType dtype = DType::f32;  // diffusers' torch_dtype
  Device device = Device::cpu();
  // enable_model_cpu_offload / enable_sequential_cpu_offload as each model loads, so loading
  // never holds more than one model either.
  OffloadMode offload = OffloadMode::none;
  std::optional<Device> offload_device;  // default: detected (first accelerator, else CPU)
  // Tensor parallelism: the models with a plan (the FLUX.1 transformer) are split over the
  // mesh's ranks, each reading only its slices; the others load whole on every rank.
  std::optional<TensorParallelConfig> tensor_parallel;
};

// Called after each denoising step with (step index, number of steps, latents after the step).
using StepCallback = std::function<void(int, int, const Tensor&)>;

struct StageTimes {
  double encode_seconds = 0;
  std::vector<double> step_seconds;
  double decode_seconds = 0;
};

struct StageMemories {
  StageMemory encode, denoise, decode;
};

struct RgbImage {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;  // HxWx3
};

struct PipelineOutput {
  Tensor image;                  // (B, H, W, 3) f32 in [0, 1], as output_type="np"
  std::vector<RgbImage> images;  // as output_type="pil"
  Tensor initial_latents;        // what the denoising loop started from
  StageTimes times;
  StageMemories memory;  // per stage (runtime/memory_stats.h)
  uint64_t seed = 0;
};

// VaeImageProcessor.postprocess: (x * 0.5 + 0.5).clamp(0, 1) in the decoder's dtype, then NHWC
// float32; uint8 as numpy's (x * 255).round() (half to even).
Tensor postprocess_image(const Tensor& decoded);
std::vector<RgbImage> to_uint8_images(const Tensor& image_nhwc);

// prompt_embeds.repeat(1, n, 1).view(B * n, ...): each row repeated n times, consecutively (the
// embeddings of num_images_per_prompt).
Tensor repeat_rows(const Tensor& x, int n);
// torch.full(shape, value, dtype): the per-image timestep and guidance inputs.
Tensor full(const Shape& shape, float value, DType dtype);

// Seconds since an arbitrary epoch, for stage timings.
double now_seconds();

}  // namespace tessera
