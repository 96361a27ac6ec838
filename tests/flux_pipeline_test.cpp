// FluxPipeline end to end against diffusers' pipeline goldens (reference/goldens/pipeline_flux.py):
// initial noise, prompt embeddings, latents after every step, and the decoded image.
#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipeline_manifest.h"
#include "pipelines/flux_pipeline.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Case {
  std::string model, name, dtype;
};

std::vector<Case> flux_cases() {
  std::vector<Case> cases;
  for (const std::string model : {"flux1-schnell-tiny", "flux1-dev-tiny"}) {
    std::ifstream in(test::fixture_path("goldens/" + model + "/index.json"));
    if (!in) continue;
    const auto index = nlohmann::json::parse(in);
    for (const auto& c : index["cases"])
      for (const std::string dtype : {"f32", "bf16"}) cases.push_back({model, c, dtype});
  }
  return cases;
}

class FluxPipelineGolden : public ::testing::TestWithParam<Case> {};

TEST_P(FluxPipelineGolden, MatchesDiffusers) {
  const Case& c = GetParam();
  const std::string dir = "goldens/" + c.model + "/pipeline/" + c.name + "/" + c.dtype + "/";
  std::ifstream in(test::fixture_path(dir + "manifest.json"));
  ASSERT_TRUE(in) << "missing " << dir << "manifest.json";
  const auto m = nlohmann::json::parse(in);
  const auto golden = test::load_fixture(dir + "tensors.safetensors");
  const DType dtype = dtype_from_name(c.dtype);

  auto pipe = FluxPipeline::from_pretrained(test::fixture_path(c.model),
                                            {.dtype = dtype, .device = test::pipeline_device()});
  FluxCallOptions call = test::call_from_manifest<FluxCallOptions>(m);
  if (m["prompt_2"].is_string()) call.prompt_2 = std::vector<std::string>{m["prompt_2"]};
  std::vector<Tensor> step_latents;
  call.on_step_end = [&](int, int, const Tensor& l) { step_latents.push_back(l); };

  // The prompt embeddings on their own, as encode_prompt gives them.
  const auto e = pipe->encode_prompt(call.prompt, call.prompt_2.value_or(call.prompt), 1,
                                     call.max_sequence_length);
  EXPECT_TRUE(test::activations_close(e.prompt_embeds, golden.at("prompt_embeds"), dtype));
  EXPECT_TRUE(
      test::activations_close(e.pooled_prompt_embeds, golden.at("pooled_prompt_embeds"), dtype));

  const PipelineOutput out = (*pipe)(call);
  // The torch-compatible generator gives diffusers' noise bit for bit.
  EXPECT_TRUE(test::bit_equal(out.initial_latents, golden.at("initial_latents")));
  ASSERT_EQ(int(step_latents.size()), *call.num_inference_steps);
  for (size_t i = 0; i < step_latents.size(); ++i) {
    SCOPED_TRACE("latents." + std::to_string(i));
    EXPECT_TRUE(test::activations_close(step_latents[i],
                                        golden.at("latents." + std::to_string(i)), dtype));
  }
  // Decoded pixels: f32 within 2/255 everywhere; bf16 within 2/255 on average.
  const auto a = out.image.to_floats(), g = golden.at("image").to_floats();
  ASSERT_EQ(a.size(), g.size());
  double max_diff = 0, sum_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(g[i]));
    max_diff = std::max(max_diff, d);
    sum_diff += d;
  }
  const double mean_diff = sum_diff / double(a.size());
  if (dtype == DType::f32) {
    EXPECT_LE(max_diff, 2.0 / 255) << "mean " << mean_diff;
  } else {
    EXPECT_LE(mean_diff, 2.0 / 255) << "max " << max_diff;
  }
  // uint8 pixels as PIL gives them.
  const auto u = golden.at("image_uint8").to_ints();
  int64_t max_u8 = 0;
  for (size_t i = 0; i < u.size(); ++i)
    max_u8 = std::max<int64_t>(max_u8, std::abs(int64_t(out.images[0].pixels[i]) - u[i]));
  if (dtype == DType::f32) EXPECT_LE(max_u8, 2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FluxPipelineGolden, ::testing::ValuesIn(flux_cases()),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.name + "_" +
                                           info.param.dtype;
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(FluxPipeline, RejectsBadArguments) {
  auto pipe = FluxPipeline::from_pretrained(test::fixture_path("flux1-schnell-tiny"));
  FluxCallOptions call;
  call.prompt = {"a cat"};
  call.height = 72;  // not a multiple of 16
  call.width = 64;
  EXPECT_THROW((*pipe)(call), Error);
  call.height = 64;
  call.num_inference_steps = 0;
  EXPECT_THROW((*pipe)(call), Error);
  call.num_inference_steps = 1;
  call.max_sequence_length = 513;
  EXPECT_THROW((*pipe)(call), Error);
  EXPECT_THROW(FluxPipeline::from_pretrained(test::fixture_path("sd35-medium-tiny")), Error);
  EXPECT_THROW(FluxPipeline::from_pretrained(test::fixture_path("flux1-schnell-tiny"),
                                             {.dtype = DType::f32, .device = Device::parse("cuda:0")}),
               Error);
}

// diffusers' FluxPipeline.__call__ has one set of defaults whatever the checkpoint: 28 steps,
// guidance 3.5, 512 T5 tokens (schnell's model card values are arguments a caller passes).
TEST(FluxPipeline, DefaultsAreTheCallDefaults) {
  for (const std::string model : {"flux1-schnell-tiny", "flux1-dev-tiny"}) {
    SCOPED_TRACE(model);
    auto pipe = FluxPipeline::from_pretrained(test::fixture_path(model));
    const FluxDefaults d = pipe->defaults();
    EXPECT_EQ(d.num_inference_steps, 28);
    EXPECT_EQ(d.guidance_scale, 3.5);
    EXPECT_EQ(d.max_sequence_length, 512);
    FluxCallOptions call;
    EXPECT_EQ(call.max_sequence_length, 512);
    call.prompt = {""};  // an empty prompt is a prompt
    call.height = call.width = 32;
    call.seed = 0;
    int steps = 0;
    call.on_step_end = [&](int, int n, const Tensor&) { steps = n; };
    (*pipe)(call);
    EXPECT_EQ(steps, 28);
  }
}

TEST(FluxPipeline, PackUnpackRoundTrip) {
  std::vector<float> v(2 * 16 * 4 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  const Tensor x = Tensor::from_floats(v, {2, 16, 4, 6});
  const Tensor packed = FluxPipeline::pack_latents(x);
  EXPECT_EQ(packed.shape(), (Shape{2, 6, 64}));
  // Feature index c*4 + dy*2 + dx of token (row, col).
  EXPECT_EQ(packed.to_floats()[1], x.to_floats()[1]);       // c0, dy0, dx1
  EXPECT_EQ(packed.to_floats()[2], x.to_floats()[6]);       // c0, dy1, dx0
  EXPECT_EQ(packed.to_floats()[4], x.to_floats()[24]);      // c1
  EXPECT_EQ(FluxPipeline::unpack_latents(packed, 32, 48, 8).to_floats(), v);
}

}  // namespace
}  // namespace tessera
