// `tessera run` as a user runs it (TESSERA_CLI_PATH): every component golden of the tiny FLUX.1
// pipelines fed through the CLI, outputs compared with diffusers'; then the error cases.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>

#include "io/safetensors.h"
#include "io_test_folder.h"
#include "models/autoencoder_kl.h"
#include "models/flux_transformer.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

using Result = test::CliResult;
using test::quote;
using test::run_cli;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// `tessera run` with the model, component, inputs and output given; `extra` appended.
Result run_component(const std::string& model, const std::string& component,
                     const std::string& inputs, const std::string& output,
                     const std::string& extra = "") {
  return run_cli("run --model " + quote(model) + " --component " + quote(component) + " --inputs " +
                 quote(inputs) + " --output " + quote(output) + " " + extra);
}

// An error is one "tessera: error: ..." line, exit 1, and no output file.
void expect_error(const Result& r, const std::string& output,
                  const std::vector<std::string>& parts) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("tessera: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const auto& p : parts) EXPECT_TRUE(contains(r.err, p)) << "no '" << p << "' in " << r.err;
  EXPECT_FALSE(fs::exists(output)) << output;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

struct GoldenCase {
  std::string pipeline, component, dtype;
};

void PrintTo(const GoldenCase& g, std::ostream* os) {
  *os << g.pipeline << " " << g.component << " " << g.dtype;
}

// The VAE's bf16 chain amplifies one-ulp rounding flips of its mid-block attention past decision
// 0008's 1% mean (autoencoder_kl_test.cpp measures and explains it; the library run gives the
// same numbers as the CLI). Held, as there, to a 3% mean and 0008's max.
::testing::AssertionResult vae_bf16_close(const Tensor& a, const Tensor& e) {
  const auto av = a.to_floats(), ev = e.to_floats();
  double mx = 0, sum = 0, ref_sum = 0, ref_max = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    const double d = std::fabs(double(av[i]) - double(ev[i]));
    mx = std::isnan(d) ? INFINITY : std::max(mx, d);
    sum += d;
    ref_sum += std::fabs(double(ev[i]));
    ref_max = std::max(ref_max, std::fabs(double(ev[i])));
  }
  if (sum <= 3e-2 * ref_sum && mx <= 5e-2 * std::max(1.0, ref_max))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "bf16 VAE activations differ: max " << mx << " mean " << sum / double(av.size())
         << " (mean|e| " << ref_sum / double(av.size()) << ")";
}

std::string case_name(const ::testing::TestParamInfo<GoldenCase>& info) {
  std::string n = info.param.pipeline + "_" + info.param.component + "_" + info.param.dtype;
  std::replace_if(
      n.begin(), n.end(), [](char c) { return !std::isalnum((unsigned char)c); }, '_');
  return n;
}

class CliRunGolden : public ::testing::TestWithParam<GoldenCase> {};

// The CLI on the golden inputs gives the golden outputs (and, with --capture, intermediates).
TEST_P(CliRunGolden, MatchesDiffusers) {
  const GoldenCase& g = GetParam();
  const std::string dir =
      "goldens/" + g.pipeline + "/components/" + g.component + "/" + g.dtype + "/";
  if (!test::has_fixture(dir + "outputs.safetensors")) GTEST_SKIP() << "missing " << dir;
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  const Result r = run_component(test::fixture_path(g.pipeline), g.component,
                                 test::fixture_path(dir + "inputs.safetensors"), out,
                                 "--dtype " + g.dtype + " --capture --hidden-states");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "wrote")) << r.out;
  const DType dtype = dtype_from_name(g.dtype);
  const auto actual = load_safetensors(out);
  auto expect_all = [&](const std::string& file) {
    if (!test::has_fixture(dir + file)) return;
    for (const auto& [name, expected] : test::load_fixture(dir + file)) {
      auto it = actual.find(name);
      ASSERT_NE(it, actual.end()) << "no tensor " << name << " in the output of " << g.component;
      EXPECT_EQ(it->second.dtype(), expected.dtype()) << name;
      ASSERT_EQ(it->second.shape(), expected.shape()) << name;
      if (dtype == DType::bf16 && g.component.rfind("vae.", 0) == 0)
        EXPECT_TRUE(vae_bf16_close(it->second, expected)) << name;
      else
        EXPECT_TRUE(test::activations_close(it->second, expected, dtype)) << name;
    }
  };
  expect_all("outputs.safetensors");
  expect_all("intermediates.safetensors");
}

std::vector<GoldenCase> golden_cases() {
  const std::vector<std::pair<const char*, std::vector<const char*>>> runs = {
      {"flux1-schnell-tiny",
       {"text_encoder", "text_encoder_2", "transformer", "vae.decode", "vae.encode"}},
      {"flux1-dev-tiny",
       {"text_encoder", "text_encoder_2", "transformer", "vae.decode", "vae.encode"}},
      // CLIPTextModelWithProjection (text_embeds), a third encoder, SD3Transformer2DModel.
      {"sd35-medium-tiny",
       {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae.decode",
        "vae.encode"}},
      // AutoencoderKLFlux2 and Flux2Transformer2DModel (integer position ids).
      {"flux2-dev-tiny", {"transformer", "vae.decode", "vae.encode"}},
  };
  std::vector<GoldenCase> cases;
  for (const auto& [p, components] : runs)
    for (const char* c : components)
      for (const char* d : {"f32", "bf16"}) cases.push_back({p, c, d});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Goldens, CliRunGolden, ::testing::ValuesIn(golden_cases()), case_name);

std::string schnell() {
  return test::fixture_path("flux1-schnell-tiny");
}
std::string golden_inputs(const std::string& component) {
  return test::fixture_path("goldens/flux1-schnell-tiny/components/" + component +
                            "/f32/inputs.safetensors");
}

TEST(CliRun, WithoutFlagsWritesOnlyTheOutputFields) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  Result r = run_component(schnell(), "text_encoder", golden_inputs("text_encoder"), out);
  ASSERT_EQ(r.code, 0) << r.err;
  auto t = load_safetensors(out);
  std::vector<std::string> names;
  for (const auto& [k, v] : t) names.push_back(k);
  EXPECT_EQ(names, (std::vector<std::string>{"last_hidden_state", "pooler_output"}));
  r = run_component(schnell(), "vae.encode", golden_inputs("vae.encode"), out);
  ASSERT_EQ(r.code, 0) << r.err;
  t = load_safetensors(out);
  EXPECT_EQ(t.size(), 6u);  // latent_dist.{parameters,mean,logvar,std,var,mode}
  EXPECT_TRUE(t.count("latent_dist.mean") && t.count("latent_dist.logvar"));
}

// The CLI adds no conversions of its own: its outputs are the library's, bit for bit.
TEST(CliRun, SameBitsAsTheLibrary) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  const std::string dir = "goldens/flux1-schnell-tiny/components/";
  if (!test::has_fixture(dir + "transformer/bf16/inputs.safetensors")) GTEST_SKIP();

  const std::string tin = test::fixture_path(dir + "transformer/bf16/inputs.safetensors");
  Result r = run_component(schnell(), "transformer", tin, out, "--dtype bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto in = load_safetensors(tin);
  const auto model =
      FluxTransformer2DModel::from_pretrained(schnell() + "/transformer", DType::bf16);
  const Tensor sample = model->forward({in.at("hidden_states"), in.at("encoder_hidden_states"),
                                        in.at("pooled_projections"), in.at("timestep"),
                                        in.at("img_ids"), in.at("txt_ids"), Tensor()});
  EXPECT_TRUE(test::bit_equal(load_safetensors(out).at("sample"), sample));

  const std::string vin = test::fixture_path(dir + "vae.decode/bf16/inputs.safetensors");
  r = run_component(schnell(), "vae.decode", vin, out, "--dtype bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto vae = AutoencoderKL::from_pretrained(schnell() + "/vae", DType::bf16);
  EXPECT_TRUE(test::bit_equal(load_safetensors(out).at("sample"),
                              vae->decode(load_safetensors(vin).at("z"))));
}

TEST(CliRun, UnknownComponentListsThePipelines) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  expect_error(
      run_component(schnell(), "unet", golden_inputs("transformer"), out), out,
      {"unknown component 'unet'", "text_encoder, text_encoder_2", "vae.decode, vae.encode"});
  expect_error(run_component(schnell(), "vae.frobnicate", golden_inputs("vae.decode"), out), out,
               {"unknown component 'vae.frobnicate'"});
  expect_error(run_component(schnell(), "vae", golden_inputs("vae.decode"), out), out,
               {"vae.decode or vae.encode"});
  expect_error(run_component(schnell(), "transformer.decode", golden_inputs("transformer"), out),
               out, {"FluxTransformer2DModel", "no .decode"});
}

TEST(CliRun, UnsupportedClassIsNamed) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  expect_error(run_component(schnell(), "scheduler", golden_inputs("transformer"), out), out,
               {"FlowMatchEulerDiscreteScheduler", "not support", "CLIPTextModel", "T5EncoderModel",
                "FluxTransformer2DModel", "AutoencoderKL"});
  expect_error(run_component(schnell(), "tokenizer", golden_inputs("transformer"), out), out,
               {"CLIPTokenizer"});
}

TEST(CliRun, MissingComponentFolder) {
  TempDir tmp;
  const std::string model = tmp / "pipe";
  fs::create_directories(model);
  fs::copy_file(schnell() + "/model_index.json", model + "/model_index.json");
  fs::create_directory_symlink(schnell() + "/text_encoder", model + "/text_encoder");
  const std::string out = tmp / "out.safetensors";
  expect_error(run_component(model, "transformer", golden_inputs("transformer"), out), out,
               {"transformer", "missing"});
  Result r = run_component(model, "text_encoder", golden_inputs("text_encoder"), out);
  EXPECT_EQ(r.code, 0) << r.err;  // the present component still runs
  EXPECT_TRUE(fs::exists(out));
}

TEST(CliRun, InputErrors) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  auto in = load_safetensors(golden_inputs("transformer"));

  // Missing input: named, with the expected names.
  auto missing = in;
  missing.erase("pooled_projections");
  save_safetensors(tmp / "missing.safetensors", missing);
  expect_error(run_component(schnell(), "transformer", tmp / "missing.safetensors", out), out,
               {"missing input tensor 'pooled_projections'", "hidden_states",
                "encoder_hidden_states", "timestep", "img_ids", "txt_ids", "guidance (optional)"});

  // Unexpected name.
  auto extra = in;
  extra["latents"] = in.at("hidden_states");
  save_safetensors(tmp / "extra.safetensors", extra);
  expect_error(run_component(schnell(), "transformer", tmp / "extra.safetensors", out), out,
               {"unexpected input tensor 'latents'", "FluxTransformer2DModel"});

  // Wrong rank, caught before the model loads.
  auto rank = in;
  rank["hidden_states"] = Tensor::zeros({24, 64}, DType::f32);
  save_safetensors(tmp / "rank.safetensors", rank);
  expect_error(run_component(schnell(), "transformer", tmp / "rank.safetensors", out), out,
               {"hidden_states", "(B, L_img, in_channels)", "(24, 64)"});

  // Right rank, wrong width: the model's own check names it.
  auto width = in;
  width["hidden_states"] = Tensor::zeros({2, 24, 60}, DType::f32);
  save_safetensors(tmp / "width.safetensors", width);
  expect_error(run_component(schnell(), "transformer", tmp / "width.safetensors", out), out,
               {"hidden_states", "60"});

  // VAE input with the wrong channel count.
  save_safetensors(tmp / "z.safetensors", {{"z", Tensor::zeros({1, 3, 4, 6}, DType::f32)}});
  expect_error(run_component(schnell(), "vae.decode", tmp / "z.safetensors", out), out, {"z"});

  // Token ids must be integers.
  save_safetensors(tmp / "ids.safetensors", {{"input_ids", Tensor::zeros({1, 8}, DType::f32)}});
  expect_error(run_component(schnell(), "text_encoder", tmp / "ids.safetensors", out), out,
               {"input_ids", "integers"});

  // An output folder that does not exist.
  const std::string nowhere = tmp / "no/such/out.safetensors";
  expect_error(run_component(schnell(), "transformer", golden_inputs("transformer"), nowhere),
               nowhere, {"cannot write", "no/such"});

  // An inputs file that does not exist.
  expect_error(run_component(schnell(), "text_encoder", tmp / "nope.safetensors", out), out,
               {"nope.safetensors"});
}

TEST(CliRun, FailedRunKeepsAnEarlierOutput) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  test::write_text(out, "old");
  const Result r = run_component(schnell(), "unet", golden_inputs("transformer"), out);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(test::read_text(out), "old");  // nothing half-written over it
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path())) left.push_back(e.path().filename());
  EXPECT_EQ(left, (std::vector<std::string>{"out.safetensors"}));
}

TEST(CliRun, RequiredFlagsThroughCli11) {
  const Result r = run_cli("run --model x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 1);  // a usage error, not a run failure
  EXPECT_TRUE(contains(r.err, "required")) << r.err;
  EXPECT_NE(run_cli("run --model x --component y --inputs a --output b --dtype f16").code, 0);
}

}  // namespace
}  // namespace tessera
