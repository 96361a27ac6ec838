// AutoencoderKL / AutoencoderKLFlux2 against diffusers goldens
// (tests/fixtures/goldens/<pipeline>/components/vae.{decode,encode}/<dtype>/, made by
// reference/goldens/pipeline_flux.py, pipeline_sd3.py and pipeline_flux2.py): every output and
// every recorded intermediate, f32 and bf16; plus loading errors and config variants.
#include "models/autoencoder_kl.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "component_goldens.h"
#include "edited_folder.h"
#include "io_test_folder.h"
#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

struct ParityCase {
  std::string pipeline;  // fixture folder, e.g. "flux1-schnell-tiny"
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<ParityCase>& info) {
  std::string n = info.param.pipeline + "_" + dtype_name(info.param.dtype);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

using test::diff_summary;

// bf16 outputs of a whole chain: this tiny random-weight VAE amplifies any bf16 rounding flip.
// One probability rounding that differs in the mid-block attention (0.05% mean, the attention
// kernel's documented one-ulp freedom) reaches 1.4% mean at the output when torch itself runs
// every later block (measured); bit-exact later blocks cannot undo it. So chained bf16
// activations are held to a mean of 3% (max as decision 0008), and every block is also checked
// on its own, fed the golden input, at the full 0008 bound (block_by_block below).
::testing::AssertionResult chained_close(const Tensor& a, const Tensor& e, DType dtype) {
  if (dtype != DType::bf16) return test::activations_close(a, e, dtype);
  const auto av = a.to_floats(), ev = e.to_floats();
  double mx = 0, sum = 0, ref_sum = 0, ref_max = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    const double d = std::fabs(double(av[i]) - double(ev[i]));
    mx = std::max(mx, d);
    sum += d;
    ref_sum += std::fabs(double(ev[i]));
    ref_max = std::max(ref_max, std::fabs(double(ev[i])));
  }
  if (sum <= 3e-2 * ref_sum && mx <= 5e-2 * std::max(1.0, ref_max))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "chained bf16 activations differ: max " << mx << " mean " << sum / double(av.size())
         << " (mean|e| " << ref_sum / double(av.size()) << ")";
}

using Golden = test::ComponentGolden;

bool load_golden(const ParityCase& p, const std::string& component, Golden* g) {
  return test::load_component_golden(p.pipeline, component, p.dtype, g);
}

// Compares every golden tensor with the one of the same name in `actual` (chained_close).
void expect_all_match(const std::map<std::string, Tensor>& golden,
                      const std::map<std::string, Tensor>& actual, DType dtype, const char* what) {
  test::expect_all_match(golden, actual, dtype, what,
                         [&](const std::string&, const Tensor& a, const Tensor& e) {
                           return chained_close(a, e, dtype);
                         });
}

std::string vae_folder(const ParityCase& p) {
  return test::fixture_path(p.pipeline + "/vae");
}

class AutoencoderKLParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(AutoencoderKLParity, DecodeMatchesDiffusers) {
  const auto& p = GetParam();
  Golden g;
  if (!load_golden(p, "vae.decode", &g)) GTEST_SKIP() << "missing vae.decode golden";
  auto vae = AutoencoderKL::from_pretrained(vae_folder(p), p.dtype);
  std::map<std::string, Tensor> capture;
  const Tensor sample = vae->decode(g.inputs.at("z"), &capture);
  expect_all_match(g.outputs, {{"sample", sample}}, p.dtype, "output");
  expect_all_match(g.intermediates, capture, p.dtype, "captured activation");
}

TEST_P(AutoencoderKLParity, EncodeMatchesDiffusers) {
  const auto& p = GetParam();
  Golden g;
  if (!load_golden(p, "vae.encode", &g)) GTEST_SKIP() << "missing vae.encode golden";
  auto vae = AutoencoderKL::from_pretrained(vae_folder(p), p.dtype);
  std::map<std::string, Tensor> capture;
  const DiagonalGaussianDistribution d = vae->encode(g.inputs.at("sample"), &capture);
  std::map<std::string, Tensor> actual = {{"latent_dist.parameters", d.parameters},
                                          {"latent_dist.mean", d.mean},
                                          {"latent_dist.logvar", d.logvar},
                                          {"latent_dist.std", d.std},
                                          {"latent_dist.mode", d.mode()}};
  if (vae->config().is_flux2()) {
    actual["bn.running_mean"] = vae->bn_running_mean;
    actual["bn.running_var"] = vae->bn_running_var;
  }
  expect_all_match(g.outputs, actual, p.dtype, "output");
  expect_all_match(g.intermediates, capture, p.dtype, "captured activation");
}

// Each block run on the golden input of that block, compared at decision 0008's bound.
void expect_block(const std::map<std::string, Tensor>& golden, const std::string& name,
                  const Tensor& actual, DType dtype) {
  auto it = golden.find(name);
  if (it == golden.end()) return;  // not recorded by this golden
  EXPECT_TRUE(test::activations_close(actual, it->second, dtype)) << name << " (block by block)";
  std::cout << "  block " << name << ": " << diff_summary(actual, it->second) << "\n";
}

TEST_P(AutoencoderKLParity, DecodeBlockByBlockMatchesDiffusers) {
  const auto& p = GetParam();
  Golden g;
  if (!load_golden(p, "vae.decode", &g)) GTEST_SKIP() << "missing vae.decode golden";
  auto vae = AutoencoderKL::from_pretrained(vae_folder(p), p.dtype);
  const auto& gi = g.intermediates;
  const auto& dec = vae->decoder;
  Tensor z = g.inputs.at("z");
  if (vae->post_quant_conv) {
    expect_block(gi, "post_quant_conv", (*vae->post_quant_conv)(z), p.dtype);
    z = gi.at("post_quant_conv");
  }
  expect_block(gi, "decoder.conv_in", dec.conv_in(z), p.dtype);
  expect_block(gi, "decoder.mid_block",
               dec.mid_block.forward(gi.at("decoder.conv_in"), "m", nullptr), p.dtype);
  std::string prev = "decoder.mid_block";
  for (size_t i = 0; i < dec.up_blocks.size(); ++i) {
    const std::string name = "decoder.up_blocks." + std::to_string(i);
    expect_block(gi, name, dec.up_blocks[i]->forward(gi.at(prev)), p.dtype);
    prev = name;
  }
  const Tensor norm_out = gi.count("decoder.conv_norm_out") ? gi.at("decoder.conv_norm_out")
                                                            : dec.conv_norm_out(gi.at(prev));
  expect_block(gi, "decoder.conv_norm_out", dec.conv_norm_out(gi.at(prev)), p.dtype);
  expect_block(gi, "decoder.conv_out", dec.conv_out(silu(norm_out)), p.dtype);
}

TEST_P(AutoencoderKLParity, EncodeBlockByBlockMatchesDiffusers) {
  const auto& p = GetParam();
  Golden g;
  if (!load_golden(p, "vae.encode", &g)) GTEST_SKIP() << "missing vae.encode golden";
  auto vae = AutoencoderKL::from_pretrained(vae_folder(p), p.dtype);
  const auto& gi = g.intermediates;
  const auto& enc = vae->encoder;
  expect_block(gi, "encoder.conv_in", enc.conv_in(g.inputs.at("sample")), p.dtype);
  std::string prev = "encoder.conv_in";
  for (size_t i = 0; i < enc.down_blocks.size(); ++i) {
    const std::string name = "encoder.down_blocks." + std::to_string(i);
    expect_block(gi, name, enc.down_blocks[i]->forward(gi.at(prev)), p.dtype);
    prev = name;
  }
  expect_block(gi, "encoder.mid_block", enc.mid_block.forward(gi.at(prev), "m", nullptr), p.dtype);
  expect_block(gi, "encoder.conv_out",
               enc.conv_out(silu(enc.conv_norm_out(gi.at("encoder.mid_block")))), p.dtype);
  if (vae->quant_conv)
    expect_block(gi, "quant_conv", (*vae->quant_conv)(gi.at("encoder.conv_out")), p.dtype);
}

INSTANTIATE_TEST_SUITE_P(Goldens, AutoencoderKLParity,
                         ::testing::Values(ParityCase{"flux1-schnell-tiny", DType::f32},
                                           ParityCase{"flux1-schnell-tiny", DType::bf16},
                                           ParityCase{"flux1-dev-tiny", DType::f32},
                                           ParityCase{"flux1-dev-tiny", DType::bf16},
                                           ParityCase{"sd35-medium-tiny", DType::f32},
                                           ParityCase{"sd35-medium-tiny", DType::bf16},
                                           ParityCase{"flux2-dev-tiny", DType::f32},
                                           ParityCase{"flux2-dev-tiny", DType::bf16}),
                         case_name);

// ---- loading errors and config variants ---------------------------------------------------

const char* kFluxVae = "flux1-schnell-tiny/vae";
const char* kFlux2Vae = "flux2-dev-tiny/vae";

using test::EditedFolder;

std::string load_error(const std::string& folder, DType dtype = DType::f32) {
  return test::load_error<AutoencoderKL>(folder, dtype);
}

TEST(AutoencoderKLErrors, ConfigNotMatchingWeightsNamesTensorAndBothShapes) {
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  EditedFolder f(kFluxVae, [](nlohmann::json& c) { c["latent_channels"] = 8; });
  const std::string msg = load_error(f.path());
  // The encoder's parameters are checked first: conv_out gives 2 * latent_channels.
  EXPECT_NE(msg.find("'encoder.conv_out.weight' has shape (32, 32, 3, 3)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the config implies (16, 32, 3, 3)"), std::string::npos) << msg;
}

TEST(AutoencoderKLErrors, MissingConfigKeyIsNamed) {
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  for (const char* key :
       {"block_out_channels", "latent_channels", "layers_per_block", "norm_num_groups"}) {
    EditedFolder f(kFluxVae, [&](nlohmann::json& c) { c.erase(key); });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  }
}

TEST(AutoencoderKLErrors, UnsupportedConfigValuesAreNamed) {
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& c) { c["act_fn"] = "mish"; }, "unsupported value act_fn='mish'"},
      {[](nlohmann::json& c) { c["norm_num_groups"] = 3; }, "unsupported value norm_num_groups=3"},
      {[](nlohmann::json& c) { c["down_block_types"][1] = "AttnDownEncoderBlock2D"; },
       "unsupported value down_block_types entry 'AttnDownEncoderBlock2D'"},
      {[](nlohmann::json& c) { c["up_block_types"] = {"UpDecoderBlock2D"}; },
       "up_block_types has 1 entries but block_out_channels has 4"},
      {[](nlohmann::json& c) { c["_class_name"] = "AutoencoderTiny"; },
       "unsupported value _class_name='AutoencoderTiny'"},
      {[](nlohmann::json& c) { c["layers_per_block"] = 0; },
       "unsupported value layers_per_block=0"},
  };
  for (const auto& [edit, expected] : cases) {
    EditedFolder f(kFluxVae, edit);
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  }
  EXPECT_NE(load_error(test::fixture_path(kFluxVae), DType::f16).find("dtype f16 is not supported"),
            std::string::npos);
  EXPECT_NE(load_error("/nonexistent/vae").find("does not exist"), std::string::npos);
}

TEST(AutoencoderKLErrors, QuantConvsMustMatchTheConfig) {
  if (!test::has_component(kFluxVae) || !test::has_component(kFlux2Vae)) GTEST_SKIP() << "missing VAE fixtures";
  {  // The config asks for quant convs the weights do not have.
    EditedFolder f(kFluxVae, [](nlohmann::json& c) { c["use_quant_conv"] = true; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("missing tensor 'quant_conv.weight'"), std::string::npos) << msg;
  }
  {  // The weights have quant convs the config has no place for.
    EditedFolder f(kFlux2Vae, [](nlohmann::json& c) { c["use_post_quant_conv"] = false; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("post_quant_conv.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has no place for"), std::string::npos) << msg;
  }
}

TEST(AutoencoderKL, ReadsPipelineFactorsFromTheConfig) {
  if (!test::has_component(kFluxVae) || !test::has_component(kFlux2Vae)) GTEST_SKIP() << "missing VAE fixtures";
  auto flux = AutoencoderKL::from_pretrained(test::fixture_path(kFluxVae), DType::f32);
  EXPECT_FALSE(flux->config().is_flux2());
  EXPECT_DOUBLE_EQ(flux->config().scaling_factor, 0.3611);
  ASSERT_TRUE(flux->config().shift_factor.has_value());
  EXPECT_DOUBLE_EQ(*flux->config().shift_factor, 0.1159);
  EXPECT_EQ(flux->scale_factor(), 8);
  EXPECT_FALSE(flux->quant_conv || flux->post_quant_conv);
  EXPECT_FALSE(flux->bn_running_mean.defined());
  auto flux2 = AutoencoderKL::from_pretrained(test::fixture_path(kFlux2Vae), DType::bf16);
  EXPECT_TRUE(flux2->config().is_flux2());
  EXPECT_DOUBLE_EQ(flux2->config().batch_norm_eps, 1e-4);
  EXPECT_EQ(flux2->bn_running_var.shape(), Shape{128});
  EXPECT_EQ(flux2->bn_running_var.dtype(), DType::bf16);
  EXPECT_TRUE(flux2->quant_conv && flux2->post_quant_conv);
}

TEST(AutoencoderKL, WithoutMidBlockAttentionDropsTheAttentionWeights) {
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  EditedFolder f(
      kFluxVae, [](nlohmann::json& c) { c["mid_block_add_attention"] = false; },
      [](const std::string& k) {
        return k.find("mid_block.attentions.") != std::string::npos ? std::string() : k;
      });
  auto vae = AutoencoderKL::from_pretrained(f.path(), DType::f32);
  std::map<std::string, Tensor> capture;
  const Tensor z = Tensor::zeros({1, 16, 2, 3}, DType::f32);
  EXPECT_EQ(vae->decode(z, &capture).shape(), (Shape{1, 3, 16, 24}));
  EXPECT_EQ(capture.count("decoder.mid_block.attentions.0"), 0u);
  // The unedited folder has attention weights this config has no place for.
  EditedFolder g(kFluxVae, [](nlohmann::json& c) { c["mid_block_add_attention"] = false; });
  EXPECT_NE(load_error(g.path()).find("mid_block.attentions.0"), std::string::npos);
}

TEST(AutoencoderKL, LoadsDeprecatedAttentionNames) {
  // Older VAE checkpoints name the mid-block attention query/key/value/proj_attn.
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  EditedFolder old(
      kFluxVae, [](nlohmann::json&) {},
      [](const std::string& k) {
        std::string n = k;
        for (const auto& [a, b] :
             std::vector<std::pair<std::string, std::string>>{{".to_q.", ".query."},
                                                              {".to_k.", ".key."},
                                                              {".to_v.", ".value."},
                                                              {".to_out.0.", ".proj_attn."}}) {
          const size_t p = n.find(a);
          if (p != std::string::npos) n = n.substr(0, p) + b + n.substr(p + a.size());
        }
        return n;
      });
  auto a = AutoencoderKL::from_pretrained(test::fixture_path(kFluxVae), DType::f32);
  auto b = AutoencoderKL::from_pretrained(old.path(), DType::f32);
  std::vector<float> v(16 * 2 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.21f * float(i));
  const Tensor z = Tensor::from_floats(v, {1, 16, 2, 3});
  EXPECT_TRUE(test::bit_equal(b->decode(z), a->decode(z)));
}

TEST(AutoencoderKL, BatchesDecodeAsSingleImages) {
  // The attention copies tokens for B > 1; each image must decode as it does alone.
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  auto vae = AutoencoderKL::from_pretrained(test::fixture_path(kFluxVae), DType::f32);
  std::vector<float> v(2 * 16 * 3 * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * float(i));
  const Tensor z = Tensor::from_floats(v, {2, 16, 3, 2});
  const Tensor both = vae->decode(z);
  for (int64_t b = 0; b < 2; ++b) {
    const Tensor one = vae->decode(contiguous(z.slice(0, b, b + 1)));
    EXPECT_TRUE(test::all_close(both.slice(0, b, b + 1), one, 1e-5, 1e-5)) << "image " << b;
  }
  const auto d = vae->encode(both);
  EXPECT_EQ(d.mean.shape(), (Shape{2, 16, 3, 2}));
}

TEST(AutoencoderKLErrors, InputsOfTheWrongShapeOrDtypeAreRefused) {
  if (!test::has_component(kFluxVae)) GTEST_SKIP() << "missing fixture " << kFluxVae;
  auto vae = AutoencoderKL::from_pretrained(test::fixture_path(kFluxVae), DType::f32);
  auto err = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err([&] {
              vae->decode(Tensor::zeros({1, 4, 2, 2}, DType::f32));
            }).find("expected z of shape (B, 16, h, w)"),
            std::string::npos);
  EXPECT_NE(err([&] {
              vae->decode(Tensor::zeros({1, 16, 2, 2}, DType::bf16));
            }).find("z is bf16 but the model is f32"),
            std::string::npos);
  EXPECT_NE(err([&] {
              vae->encode(Tensor::zeros({1, 4, 16, 16}, DType::f32));
            }).find("expected sample of shape (B, 3, H, W)"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
