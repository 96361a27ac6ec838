#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "schedulers/flow_match_euler_discrete.h"
#include "test_util.h"

namespace tessera {
namespace {

FlowMatchEulerDiscreteConfig config_from(const nlohmann::json& j) {
  FlowMatchEulerDiscreteConfig c;
  c.num_train_timesteps = j.value("num_train_timesteps", 1000);
  c.shift = j.value("shift", 1.0);
  c.use_dynamic_shifting = j.value("use_dynamic_shifting", false);
  c.base_shift = j.value("base_shift", 0.5);
  c.max_shift = j.value("max_shift", 1.15);
  c.base_image_seq_len = j.value("base_image_seq_len", 256);
  c.max_image_seq_len = j.value("max_image_seq_len", 4096);
  if (j.contains("shift_terminal")) c.shift_terminal = j["shift_terminal"].get<double>();
  c.time_shift_type = j.value("time_shift_type", std::string("exponential"));
  return c;
}

// Every (config, steps, image size) case the pipelines use gives diffusers' float32 timesteps
// and sigmas bit for bit, including the mu each pipeline computes.
TEST(FlowMatchEulerDiscrete, MatchesDiffusersBitForBit) {
  std::ifstream in(test::fixture_path("schedulers/cases.json"));
  ASSERT_TRUE(in) << "missing fixture schedulers/cases.json";
  const auto cases = nlohmann::json::parse(in);
  const auto golden = test::load_fixture("schedulers/schedules.safetensors");
  int checked = 0;
  for (const auto& [name, c] : cases.items()) {
    SCOPED_TRACE(name);
    FlowMatchEulerDiscreteScheduler sched(config_from(c["config"]));
    const auto& call = c["call"];
    const int steps = call["steps"].get<int>();
    std::optional<std::vector<double>> sigmas;
    std::optional<double> mu;
    if (call["sigmas"].is_string()) sigmas = np_linspace(1.0, 1.0 / steps, steps);
    if (call["mu"].is_number()) {
      mu = call["mu"].get<double>();
      const int64_t seq = call["image_seq_len"].get<int64_t>();
      const auto& cfg = sched.config();
      const double expected_mu =
          name.rfind("flux2", 0) == 0
              ? compute_empirical_mu(seq, steps)
              : calculate_shift(seq, cfg.base_image_seq_len, cfg.max_image_seq_len,
                                cfg.base_shift, cfg.max_shift);
      EXPECT_EQ(expected_mu, *mu);
    }
    sched.set_timesteps(steps, sigmas, mu);
    const Tensor t = Tensor::from_floats(sched.timesteps(), {int64_t(steps)});
    const Tensor s = Tensor::from_floats(sched.sigmas(), {int64_t(steps) + 1});
    EXPECT_TRUE(test::bit_equal(t, golden.at(name + ".timesteps")));
    EXPECT_TRUE(test::bit_equal(s, golden.at(name + ".sigmas")));
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

TEST(FlowMatchEulerDiscrete, RejectsBadCalls) {
  FlowMatchEulerDiscreteConfig c;
  c.use_dynamic_shifting = true;
  FlowMatchEulerDiscreteScheduler s(c);
  EXPECT_THROW(s.set_timesteps(4, std::nullopt, std::nullopt), Error);
  EXPECT_THROW(s.set_timesteps(0, std::nullopt, 0.5), Error);
  EXPECT_THROW(s.set_timesteps(4, std::vector<double>{1.0, 0.5}, 0.5), Error);
}

}  // namespace
}  // namespace tessera
