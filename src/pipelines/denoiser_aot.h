// A pipeline's denoiser built from its config alone and called once on inputs of the shapes
// its pipeline gives it, so the denoiser's programs can be compiled ahead of time (tessera
// compile, decision 0046): parameters are uninitialised tensors on the device, so no weight is
// read and a folder of configs is enough.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/compile.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace tessera {

struct DenoiserAotOptions {
  Device device;
  DType dtype = DType::bf16;
  int64_t height = 1024, width = 1024;
  int64_t max_sequence_length = 0;  // 0: the pipeline's default (FLUX.1: 512, SD3: 256 T5 tokens)
  int64_t batch = 0;                // 0: the pipeline's default call (SD3: 2, for guidance)
  bool regional = false;            // compile_repeated_blocks instead of compile
  // SPMD (decision 0060): the denoiser split by its TP plan over this many devices of the
  // target from `device` (tessera compile --tp 4 on tpu:v6e:2x2): one program per chip's part.
  int tp = 1;
  CompileOptions compile;
};

struct DenoiserAotInfo {
  std::string pipeline;       // "FluxPipeline"
  std::string model;          // "FluxTransformer2DModel"
  int64_t parameters = 0;     // elements
  int64_t parameter_bytes = 0;
  std::string inputs;         // "hidden_states bf16[1, 4096, 64], ..."
  int64_t split_parameter_bytes = 0;  // of parameter_bytes, split over the devices (--tp)
};

// Builds the denoiser of the pipeline folder `folder` (model_index.json and the denoiser's
// config.json) on `o.device` and runs its forward once in compiled mode. Throws "[compile] ..."
// for a pipeline class without a denoiser it can build, or a size the pipeline refuses.
DenoiserAotInfo trace_denoiser(const std::string& folder, const DenoiserAotOptions& o);

}  // namespace tessera
