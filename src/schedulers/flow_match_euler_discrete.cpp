#include "schedulers/flow_match_euler_discrete.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "runtime/error.h"

namespace tessera {

FlowMatchEulerDiscreteConfig FlowMatchEulerDiscreteConfig::from_json_file(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in, path, ": cannot open scheduler config");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  TESSERA_CHECK(!j.is_discarded() && j.is_object(), path, ": not a valid JSON object");
  FlowMatchEulerDiscreteConfig c;
  auto num = [&](const char* key, auto& field) {
    if (j.contains(key) && !j[key].is_null()) {
      TESSERA_CHECK(j[key].is_number() || j[key].is_boolean(), path, ": key '", key,
                    "' must be a number");
      field = j[key].get<std::decay_t<decltype(field)>>();
    }
  };
  num("num_train_timesteps", c.num_train_timesteps);
  num("shift", c.shift);
  num("use_dynamic_shifting", c.use_dynamic_shifting);
  num("base_shift", c.base_shift);
  num("max_shift", c.max_shift);
  num("base_image_seq_len", c.base_image_seq_len);
  num("max_image_seq_len", c.max_image_seq_len);
  num("invert_sigmas", c.invert_sigmas);
  if (j.contains("shift_terminal") && j["shift_terminal"].is_number())
    c.shift_terminal = j["shift_terminal"].get<double>();
  if (j.contains("time_shift_type") && j["time_shift_type"].is_string())
    c.time_shift_type = j["time_shift_type"].get<std::string>();
  TESSERA_CHECK(c.time_shift_type == "exponential" || c.time_shift_type == "linear", path,
                ": time_shift_type must be 'exponential' or 'linear', got '", c.time_shift_type,
                "'");
  for (const char* unsupported : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                                  "stochastic_sampling"}) {
    TESSERA_CHECK(!(j.contains(unsupported) && j[unsupported].is_boolean() &&
                    j[unsupported].get<bool>()),
                  path, ": '", unsupported, "' is not supported by tessera's scheduler");
  }
  TESSERA_CHECK(c.num_train_timesteps > 0, path, ": num_train_timesteps must be positive");
  return c;
}

std::vector<double> np_linspace(double start, double stop, int num) {
  std::vector<double> y(size_t(std::max(num, 0)));
  if (num == 1) {
    y[0] = start;
    return y;
  }
  const double step = (stop - start) / double(num - 1);
  for (int i = 0; i < num; ++i) y[size_t(i)] = double(i) * step + start;
  if (num > 1) y.back() = stop;
  return y;
}

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                       double base_shift, double max_shift) {
  const double m = (max_shift - base_shift) / double(max_seq_len - base_seq_len);
  const double b = base_shift - m * double(base_seq_len);
  return double(image_seq_len) * m + b;
}

double compute_empirical_mu(int64_t image_seq_len, int num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  if (image_seq_len > 4300) return a2 * double(image_seq_len) + b2;
  const double m_200 = a2 * double(image_seq_len) + b2;
  const double m_10 = a1 * double(image_seq_len) + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * double(num_steps) + b;
}

FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(FlowMatchEulerDiscreteConfig c)
    : config_(std::move(c)) {
  // The constructor's torch float32 table; only its ends (sigma_max, sigma_min) are used later.
  const float n = float(config_.num_train_timesteps);
  auto shifted = [&](float s) {
    if (config_.use_dynamic_shifting) return s;
    const float shift = float(config_.shift);
    return shift * s / (1.f + float(config_.shift - 1.0) * s);
  };
  sigma_max_ = shifted(n / n);
  sigma_min_ = shifted(1.f / n);
}

void FlowMatchEulerDiscreteScheduler::set_timesteps(int steps,
                                                    const std::optional<std::vector<double>>& in,
                                                    std::optional<double> mu) {
  TESSERA_CHECK(steps >= 1, "[scheduler] num_inference_steps must be >= 1, got ", steps);
  TESSERA_CHECK(!config_.use_dynamic_shifting || mu.has_value(),
                "[scheduler] mu must be passed when use_dynamic_shifting is true");
  TESSERA_CHECK(!in || int(in->size()) == steps, "[scheduler] got ", in ? in->size() : 0,
                " sigmas for ", steps, " steps");
  const double n = config_.num_train_timesteps;
  std::vector<float> sig(static_cast<size_t>(steps));
  if (!in) {
    // No sigmas: float64 numpy arithmetic from the (already shifted) constructor table, then
    // shifted again; the result is cast to float32 once at the end.
    std::vector<double> t = np_linspace(double(sigma_max_) * n, double(sigma_min_) * n, steps);
    for (int i = 0; i < steps; ++i) {
      double s = t[size_t(i)] / n;
      if (config_.use_dynamic_shifting) {
        const double e = config_.time_shift_type == "exponential" ? std::exp(*mu) : *mu;
        s = e / (e + (1.0 / s - 1.0));
      } else {
        s = config_.shift * s / (1.0 + (config_.shift - 1.0) * s);
      }
      sig[size_t(i)] = float(s);
    }
  } else {
    // Given sigmas: numpy float32 arithmetic (Python scalars are weak and become float32).
    for (int i = 0; i < steps; ++i) {
      const float s = float((*in)[size_t(i)]);
      if (config_.use_dynamic_shifting) {
        const float e = config_.time_shift_type == "exponential" ? float(std::exp(*mu)) : float(*mu);
        sig[size_t(i)] = e / (e + (1.f / s - 1.f));
      } else {
        sig[size_t(i)] =
            float(config_.shift) * s / (1.f + float(config_.shift - 1.0) * s);
      }
    }
  }
  if (config_.shift_terminal) {
    const float one_minus_last = 1.f - sig.back();
    const float scale = one_minus_last / float(1.0 - *config_.shift_terminal);
    for (auto& s : sig) s = 1.f - ((1.f - s) / scale);
  }
  timesteps_.resize(size_t(steps));
  if (config_.invert_sigmas) {
    for (auto& s : sig) s = 1.f - s;
  }
  for (int i = 0; i < steps; ++i) timesteps_[size_t(i)] = sig[size_t(i)] * float(n);
  sigmas_ = sig;
  sigmas_.push_back(config_.invert_sigmas ? 1.f : 0.f);
}

Tensor FlowMatchEulerDiscreteScheduler::step(const Tensor& model_output, int i,
                                             const Tensor& sample) const {
  TESSERA_CHECK(i >= 0 && i + 1 < int(sigmas_.size()), "[scheduler] step index ", i,
                " out of range for ", sigmas_.size() - 1, " steps (call set_timesteps first)");
  const float dt = sigmas_[size_t(i) + 1] - sigmas_[size_t(i)];
  const Tensor prev = add(astype(sample, DType::f32), mul(model_output, double(dt)));
  return astype(prev, model_output.dtype());
}

}  // namespace tessera
