// FlowMatchEulerDiscreteScheduler, computed exactly as diffusers does it (the float32/float64
// steps and their order matter for bit-level parity; see PARITY_NOTES.md).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessera {

struct FlowMatchEulerDiscreteConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int base_image_seq_len = 256;
  int max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::optional<double> shift_terminal;
  std::string time_shift_type = "exponential";  // or "linear"

  // Reads scheduler_config.json. Unknown keys are ignored; options tessera does not implement
  // (karras/exponential/beta sigmas, stochastic sampling) are refused with a clear error.
  static FlowMatchEulerDiscreteConfig from_json_file(const std::string& path);
};

class FlowMatchEulerDiscreteScheduler {
 public:
  explicit FlowMatchEulerDiscreteScheduler(FlowMatchEulerDiscreteConfig config);

  // As diffusers' set_timesteps(num_inference_steps, sigmas=..., mu=...). `sigmas` (if given)
  // are the pipeline's float64 values; `mu` is required with dynamic shifting.
  void set_timesteps(int num_inference_steps, const std::optional<std::vector<double>>& sigmas,
                     std::optional<double> mu);

  // One Euler step from sigmas[i] to sigmas[i+1], as diffusers: the sample is upcast to f32,
  // (sigma_next - sigma) * model_output is computed in the model output's dtype (so a bf16 model
  // rounds it to bf16), added in f32 and cast back to the model output's dtype.
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample) const;

  // float32 values, as the torch tensors diffusers keeps. sigmas has one more entry (the final 0).
  const std::vector<float>& timesteps() const { return timesteps_; }
  const std::vector<float>& sigmas() const { return sigmas_; }
  const FlowMatchEulerDiscreteConfig& config() const { return config_; }
  float sigma_max() const { return sigma_max_; }
  float sigma_min() const { return sigma_min_; }

 private:
  FlowMatchEulerDiscreteConfig config_;
  float sigma_max_ = 1.f, sigma_min_ = 0.f;
  std::vector<float> timesteps_, sigmas_;
};

// numpy.linspace(start, stop, num) in float64 (start + i*step, the last value exactly `stop`).
std::vector<double> np_linspace(double start, double stop, int num);
// FLUX.1 / SD3: mu = image_seq_len * m + b, the line through (base_seq, base_shift) and
// (max_seq, max_shift).
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                       double base_shift, double max_shift);
// FLUX.2: mu fitted to the image sequence length and the number of steps.
double compute_empirical_mu(int64_t image_seq_len, int num_steps);

}  // namespace tessera
