// Flux2Pipeline end to end against diffusers' pipeline goldens (tests/fixtures/goldens/
// flux2-dev-tiny/pipeline/<case>/<dtype>/): chat-template ids, prompt embeddings, the noise drawn
// in FLUX.2's order, the scheduler state, latents after every step, the VAE input and the image;
// model and sequential offload give the same bits; defaults and argument errors.
#include "pipelines/flux2_pipeline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mistral3_tolerance.h"
#include "pipeline_manifest.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kModel = "flux2-dev-tiny";

struct Case {
  std::string name, dtype;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  std::ifstream in(test::fixture_path(std::string("goldens/") + kModel + "/index.json"));
  if (!in) return out;
  const auto index = nlohmann::json::parse(in);
  for (const auto& c : index["cases"])
    for (const std::string dtype : {"f32", "bf16"}) out.push_back({c, dtype});
  return out;
}

struct Golden {
  nlohmann::json manifest;
  std::map<std::string, Tensor> t;
};

Golden load_golden(const Case& c) {
  const std::string dir =
      std::string("goldens/") + kModel + "/pipeline/" + c.name + "/" + c.dtype + "/";
  std::ifstream in(test::fixture_path(dir + "manifest.json"));
  Golden g;
  g.manifest = nlohmann::json::parse(in);
  g.t = test::load_fixture(dir + "tensors.safetensors");
  return g;
}

Flux2CallOptions call_of(const nlohmann::json& m) {
  return test::call_from_manifest<Flux2CallOptions>(m);
}

// f32: every pixel within 2/255; bf16: within 2/255 on average (decision 0008).
void expect_image_close(const Tensor& image, const Tensor& golden, DType dtype) {
  const auto a = image.to_floats(), g = golden.to_floats();
  ASSERT_EQ(a.size(), g.size());
  double max_diff = 0, sum_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(g[i]));
    max_diff = std::max(max_diff, d);
    sum_diff += d;
  }
  const double mean_diff = sum_diff / double(a.size());
  std::cout << "  image: max " << max_diff * 255 << "/255, mean " << mean_diff * 255 << "/255\n";
  if (dtype == DType::f32)
    EXPECT_LE(max_diff, 2.0 / 255) << "mean " << mean_diff;
  else
    EXPECT_LE(mean_diff, 2.0 / 255) << "max " << max_diff;
}

class Flux2PipelineGolden : public ::testing::TestWithParam<Case> {};

TEST_P(Flux2PipelineGolden, MatchesDiffusers) {
  const Case& c = GetParam();
  const Golden g = load_golden(c);
  const DType dtype = dtype_from_name(c.dtype);
  auto pipe = Flux2Pipeline::from_pretrained(
      test::fixture_path(kModel), {.dtype = dtype, .device = test::pipeline_device()});
  Flux2CallOptions call = call_of(g.manifest);

  const auto e = pipe->encode_prompt(call.prompt, 1, call.max_sequence_length);
  EXPECT_TRUE(test::bit_equal(e.input_ids, g.t.at("input_ids")));
  EXPECT_TRUE(test::bit_equal(e.attention_mask, g.t.at("attention_mask")));
  EXPECT_TRUE(test::bit_equal(e.text_ids, g.t.at("text_ids").select(0, 0)));
  EXPECT_TRUE(test::text_encoder_close(e.prompt_embeds, g.t.at("prompt_embeds"), dtype));

  std::vector<Tensor> step_latents;
  call.on_step_end = [&](int, int, const Tensor& l) { step_latents.push_back(l); };
  const PipelineOutput out = (*pipe)(call);
  // The torch-compatible generator, drawn in FLUX.2's patchified shape: diffusers' noise exactly.
  EXPECT_TRUE(test::bit_equal(out.initial_latents, g.t.at("initial_latents")));
  EXPECT_EQ(pipe->scheduler->sigmas(), g.t.at("sigmas").to_floats());
  EXPECT_EQ(pipe->scheduler->timesteps(), g.t.at("timesteps").to_floats());
  ASSERT_EQ(int(step_latents.size()), *call.num_inference_steps);
  for (size_t i = 0; i < step_latents.size(); ++i) {
    SCOPED_TRACE("latents." + std::to_string(i));
    EXPECT_TRUE(
        test::activations_close(step_latents[i], g.t.at("latents." + std::to_string(i)), dtype));
  }
  expect_image_close(out.image, g.t.at("image"), dtype);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2PipelineGolden, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string n = info.param.name + "_" + info.param.dtype;
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The decode path on the golden's own final latents: scatter, BatchNorm de-normalisation and
// un-patchify give the VAE input diffusers gave.
TEST(Flux2Pipeline, VaeInputFromFinalLatents) {
  const Golden g = load_golden({"robot_96x48", "f32"});
  auto pipe = Flux2Pipeline::from_pretrained(test::fixture_path(kModel));
  const int64_t n = g.manifest["num_inference_steps"].get<int64_t>();
  const Tensor last = g.t.at("latents." + std::to_string(n - 1));
  pipe->vae->decode(g.t.at("vae_z"));  // the VAE is loaded (no offload here)
  const Tensor z = pipe->latents_to_vae_input(last, 96 / 16, 48 / 16);
  EXPECT_TRUE(test::activations_close(z, g.t.at("vae_z"), DType::f32));
  EXPECT_TRUE(test::bit_equal(Flux2Pipeline::latent_ids(6, 3), g.t.at("latent_ids").select(0, 0)));
}

// Model offload and sequential offload (transformer blocks and text-encoder layers streamed)
// give the bits of the run without offload.
TEST(Flux2Pipeline, OffloadIsBitIdentical) {
  const Golden g = load_golden({"cat_64x64", "bf16"});
  Flux2CallOptions call = call_of(g.manifest);
  call.max_sequence_length = 64;
  Tensor reference;
  for (OffloadMode mode : {OffloadMode::none, OffloadMode::model, OffloadMode::sequential}) {
    SCOPED_TRACE(offload_mode_name(mode));
    auto pipe = Flux2Pipeline::from_pretrained(test::fixture_path(kModel),
                                               {.dtype = DType::bf16, .offload = mode});
    const PipelineOutput out = (*pipe)(call);
    if (mode == OffloadMode::none)
      reference = out.image;
    else
      EXPECT_TRUE(test::bit_equal(out.image, reference));
  }
}

TEST(Flux2Pipeline, DefaultsAndErrors) {
  auto pipe = Flux2Pipeline::from_pretrained(test::fixture_path(kModel));
  const PipelineDefaults d = pipe->pipeline_defaults();
  EXPECT_EQ(d.num_inference_steps, 50);
  EXPECT_EQ(d.guidance_scale, 4.0);
  EXPECT_EQ(d.max_sequence_length, 512);
  EXPECT_EQ(pipe->vae_scale_factor(), 8);
  Flux2CallOptions call;
  call.prompt = {"a cat"};
  call.height = 72;  // not a multiple of 16
  call.width = 64;
  EXPECT_NE(test::error_message([&] { (*pipe)(call); }).find("multiples of 16"), std::string::npos);
  call.height = 64;
  call.num_inference_steps = 0;
  EXPECT_THROW((*pipe)(call), Error);
  TextToImageOptions t;
  t.prompt = {"a cat"};
  t.prompt_2 = std::vector<std::string>{"x"};
  EXPECT_NE(test::error_message([&] { pipe->generate(t); }).find("no prompt_2"), std::string::npos);
  EXPECT_THROW(Flux2Pipeline::from_pretrained(test::fixture_path("flux1-schnell-tiny")), Error);
}

// A prompt longer than max_sequence_length is cut (diffusers truncates too) and still runs.
TEST(Flux2Pipeline, LongPromptIsTruncated) {
  auto pipe = Flux2Pipeline::from_pretrained(test::fixture_path(kModel));
  std::string prompt;
  for (int i = 0; i < 200; ++i) prompt += "a photo of a cat ";
  const auto e = pipe->encode_prompt({prompt}, 2, 32);
  EXPECT_EQ(e.input_ids.shape(), (Shape{1, 32}));
  EXPECT_EQ(e.prompt_embeds.shape(), (Shape{2, 32, 96}));
}

}  // namespace
}  // namespace tessera
