// FluxTransformer2DModel against diffusers goldens (tests/fixtures/goldens/<pipeline>/components/
// transformer/<dtype>/, made by reference/goldens/pipeline_flux.py): the output and every
// recorded intermediate, f32 and bf16, schnell (no guidance) and dev (guidance); plus errors.
#include "models/flux_transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "component_goldens.h"
#include "edited_folder.h"
#include "io_test_folder.h"
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

FluxTransformerInputs inputs_from(const std::map<std::string, Tensor>& t) {
  auto get = [&](const char* name) {
    auto it = t.find(name);
    return it == t.end() ? Tensor() : it->second;
  };
  return {get("hidden_states"),
          get("encoder_hidden_states"),
          get("pooled_projections"),
          get("timestep"),
          get("img_ids"),
          get("txt_ids"),
          get("guidance")};
}


class FluxTransformerParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(FluxTransformerParity, OutputAndEveryIntermediateMatchDiffusers) {
  const auto& p = GetParam();
  test::ComponentGolden g;
  if (!test::load_component_golden(p.pipeline, "transformer", p.dtype, &g))
    GTEST_SKIP() << "missing transformer golden of " << p.pipeline;
  auto model = FluxTransformer2DModel::from_pretrained(
      test::fixture_path(p.pipeline + "/transformer"), p.dtype);

  std::map<std::string, Tensor> capture;
  const Tensor sample = model->forward(inputs_from(g.inputs), &capture);
  ASSERT_EQ(g.outputs.count("sample"), 1u);
  test::expect_all_match(g.outputs, {{"sample", sample}}, p.dtype, "output");
  test::expect_all_match(g.intermediates, capture, p.dtype, "captured activation",
                         [&](const std::string& name, const Tensor& a, const Tensor& e) {
                           // cos/sin are computed in float64 and rounded to f32 in both dtypes.
                           const bool rope = name.rfind("pos_embed.", 0) == 0;
                           return test::activations_close(a, e, rope ? DType::f32 : p.dtype);
                         });
  EXPECT_EQ(capture.size(), g.intermediates.size());
}

INSTANTIATE_TEST_SUITE_P(Goldens, FluxTransformerParity,
                         ::testing::Values(ParityCase{"flux1-schnell-tiny", DType::f32},
                                           ParityCase{"flux1-schnell-tiny", DType::bf16},
                                           ParityCase{"flux1-dev-tiny", DType::f32},
                                           ParityCase{"flux1-dev-tiny", DType::bf16}),
                         case_name);

using test::EditedFolder;

std::string load_error(const std::string& folder, DType dtype = DType::f32) {
  return test::load_error<FluxTransformer2DModel>(folder, dtype);
}

bool have_tiny(const char* pipeline) {
  return test::has_fixture(std::string(pipeline) + "/transformer/config.json");
}

TEST(FluxTransformerErrors, ConfigNotMatchingWeightsNamesTensorAndBothShapes) {
  if (!have_tiny("flux1-schnell-tiny")) GTEST_SKIP() << "missing fixture flux1-schnell-tiny";
  EditedFolder f("flux1-schnell-tiny/transformer", [](nlohmann::json& c) { c["joint_attention_dim"] = 48; });
  const std::string msg = load_error(f.path());
  EXPECT_NE(msg.find("'context_embedder.weight' has shape (32, 32)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the config implies (32, 48)"), std::string::npos) << msg;
}

TEST(FluxTransformerErrors, ConfigWithFewerLayersThanWeightsIsRefused) {
  if (!have_tiny("flux1-schnell-tiny")) GTEST_SKIP() << "missing fixture flux1-schnell-tiny";
  EditedFolder f("flux1-schnell-tiny/transformer", [](nlohmann::json& c) { c["num_single_layers"] = 1; });
  const std::string msg = load_error(f.path());
  EXPECT_NE(msg.find("single_transformer_blocks.1."), std::string::npos) << msg;
  EXPECT_NE(msg.find("has no place for"), std::string::npos) << msg;
}

TEST(FluxTransformerErrors, GuidanceEmbedsMismatchNamesMissingTensor) {
  if (!have_tiny("flux1-schnell-tiny")) GTEST_SKIP() << "missing fixture flux1-schnell-tiny";
  EditedFolder f("flux1-schnell-tiny/transformer", [](nlohmann::json& c) { c["guidance_embeds"] = true; });
  const std::string msg = load_error(f.path());
  EXPECT_NE(msg.find("missing tensor 'time_text_embed.guidance_embedder.linear_1.weight'"),
            std::string::npos)
      << msg;
}

TEST(FluxTransformerErrors, MissingConfigKeyIsNamed) {
  if (!have_tiny("flux1-schnell-tiny")) GTEST_SKIP() << "missing fixture flux1-schnell-tiny";
  EditedFolder f("flux1-schnell-tiny/transformer", [](nlohmann::json& c) { c.erase("num_layers"); });
  const std::string msg = load_error(f.path());
  EXPECT_NE(msg.find("num_layers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

TEST(FluxTransformerErrors, UnsupportedConfigValuesAreNamed) {
  if (!have_tiny("flux1-schnell-tiny")) GTEST_SKIP() << "missing fixture flux1-schnell-tiny";
  {
    EditedFolder f("flux1-schnell-tiny/transformer", [](nlohmann::json& c) {
      c["axes_dims_rope"] = {4, 6, 8};
    });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("unsupported value axes_dims_rope (sum 18)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("attention_head_dim=16"), std::string::npos) << msg;
  }
  {
    EditedFolder f("flux1-schnell-tiny/transformer",
                   [](nlohmann::json& c) { c["_class_name"] = "Flux2Transformer2DModel"; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("unsupported _class_name 'Flux2Transformer2DModel'"), std::string::npos)
        << msg;
  }
  {
    EditedFolder f("flux1-schnell-tiny/transformer", [](nlohmann::json& c) { c["num_attention_heads"] = 0; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("unsupported value num_attention_heads=0"), std::string::npos) << msg;
  }
  EXPECT_NE(load_error(test::fixture_path("flux1-schnell-tiny/transformer"), DType::f16)
                .find("dtype f16 is not supported"),
            std::string::npos);
  EXPECT_NE(load_error("/nonexistent/transformer").find("does not exist"), std::string::npos);
}

TEST(FluxTransformerErrors, GuidanceMustMatchGuidanceEmbeds) {
  for (const char* p : {"flux1-schnell-tiny", "flux1-dev-tiny"}) {
    const std::string golden = std::string("goldens/") + p + "/components/transformer/f32/";
    if (!test::has_fixture(golden + "inputs.safetensors")) GTEST_SKIP() << "missing " << golden;
    auto model = FluxTransformer2DModel::from_pretrained(
        test::fixture_path(std::string(p) + "/transformer"), DType::f32);
    auto in = inputs_from(test::load_fixture(golden + "inputs.safetensors"));
    const bool dev = model->config.guidance_embeds;
    in.guidance = dev ? Tensor() : Tensor::from_floats({3.5f, 3.5f}, {2});
    try {
      model->forward(in);
      ADD_FAILURE() << p << ": expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(dev ? "guidance must be" : "guidance was given"),
                std::string::npos)
          << e.what();
    }
  }
}

// The block API regional compilation calls: a single block on (hidden, encoder) pairs gives the
// golden of the next block from the golden of the previous one.
TEST(FluxTransformer, SingleBlockOnGoldenInputsMatchesGoldenOutputs) {
  const std::string golden = "goldens/flux1-schnell-tiny/components/transformer/f32/";
  if (!test::has_fixture(golden + "intermediates.safetensors"))
    GTEST_SKIP() << "missing " << golden;
  auto model = FluxTransformer2DModel::from_pretrained(
      test::fixture_path("flux1-schnell-tiny/transformer"), DType::f32);
  auto t = test::load_fixture(golden + "intermediates.safetensors");
  const flux::RotaryEmbedding rotary{t.at("pos_embed.cos"), t.at("pos_embed.sin")};
  auto out = (*model->single_transformer_blocks[1])(
      t.at("single_transformer_blocks.0.hidden_states"),
      t.at("single_transformer_blocks.0.encoder_hidden_states"), t.at("time_text_embed"), rotary);
  EXPECT_TRUE(test::activations_close(
      out.hidden_states, t.at("single_transformer_blocks.1.hidden_states"), DType::f32));
  EXPECT_TRUE(test::activations_close(out.encoder_hidden_states,
                                      t.at("single_transformer_blocks.1.encoder_hidden_states"),
                                      DType::f32));
  auto dbl = (*model->transformer_blocks[1])(t.at("transformer_blocks.0.hidden_states"),
                                             t.at("transformer_blocks.0.encoder_hidden_states"),
                                             t.at("time_text_embed"), rotary);
  EXPECT_TRUE(test::activations_close(dbl.hidden_states, t.at("transformer_blocks.1.hidden_states"),
                                      DType::f32));
  EXPECT_TRUE(test::activations_close(
      dbl.encoder_hidden_states, t.at("transformer_blocks.1.encoder_hidden_states"), DType::f32));
}

TEST(FluxTransformer, ExposesRepeatedBlocksAndParameterNames) {
  if (!have_tiny("flux1-dev-tiny")) GTEST_SKIP() << "missing fixture flux1-dev-tiny";
  auto model = FluxTransformer2DModel::from_pretrained(
      test::fixture_path("flux1-dev-tiny/transformer"), DType::bf16);
  EXPECT_EQ(model->transformer_blocks.size(), 2u);
  EXPECT_EQ(model->single_transformer_blocks.size(), 2u);
  EXPECT_EQ(model->dtype(), DType::bf16);
  EXPECT_EQ(model->transformer_blocks[0]->attn.to_out_0->weight.dtype(), DType::bf16);
  // 112 tensors in the checkpoint, every one used.
  EXPECT_EQ(model->named_parameters().size(), 112u);
}

}  // namespace
}  // namespace tessera
