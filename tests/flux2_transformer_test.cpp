// Flux2Transformer2DModel against diffusers goldens (tests/fixtures/goldens/flux2-dev-tiny/
// components/transformer/<dtype>/): the output and every recorded intermediate (modulations,
// rotary tables, each block and its attention), f32 and bf16; regional compilation; errors.
#include "models/flux2_transformer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "component_goldens.h"
#include "edited_folder.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kFixture = "flux2-dev-tiny";

Flux2TransformerInputs inputs_from(const std::map<std::string, Tensor>& t) {
  auto get = [&](const char* name) {
    auto it = t.find(name);
    return it == t.end() ? Tensor() : it->second;
  };
  return {get("hidden_states"), get("encoder_hidden_states"),
          get("timestep"),      get("img_ids"),
          get("txt_ids"),       get("guidance")};
}

class Flux2TransformerParity : public ::testing::TestWithParam<DType> {};

TEST_P(Flux2TransformerParity, OutputAndEveryIntermediateMatchDiffusers) {
  const DType dtype = GetParam();
  test::ComponentGolden g;
  if (!test::load_component_golden(kFixture, "transformer", dtype, &g))
    GTEST_SKIP() << "missing transformer golden of " << kFixture;
  auto model = Flux2Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kFixture) + "/transformer"), dtype);
  std::map<std::string, Tensor> capture;
  const Tensor sample = model->forward(inputs_from(g.inputs), &capture);
  test::expect_all_match(g.outputs, {{"sample", sample}}, dtype, "output");
  test::expect_all_match(g.intermediates, capture, dtype, "captured activation",
                         [&](const std::string& name, const Tensor& a, const Tensor& e) {
                           // cos/sin are computed in float64 and rounded to f32 in both dtypes.
                           const bool rope = name.rfind("pos_embed.", 0) == 0;
                           return test::activations_close(a, e, rope ? DType::f32 : dtype);
                         });
  EXPECT_EQ(capture.size(), g.intermediates.size());
}

INSTANTIATE_TEST_SUITE_P(Goldens, Flux2TransformerParity,
                         ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Regional compilation runs each block class as one program with the weights as inputs; its
// result is the eager result bit for bit.
TEST(Flux2Transformer, RegionalCompileIsBitEqualToEager) {
  test::ComponentGolden g;
  if (!test::load_component_golden(kFixture, "transformer", DType::bf16, &g))
    GTEST_SKIP() << "missing transformer golden of " << kFixture;
  auto model = Flux2Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kFixture) + "/transformer"), DType::bf16);
  model->reset_compile();
  const Tensor eager = model->forward(inputs_from(g.inputs));
  model->compile_repeated_blocks();
  const Tensor compiled = model->forward(inputs_from(g.inputs));
  const Tensor again = model->forward(inputs_from(g.inputs));
  EXPECT_TRUE(test::bit_equal(compiled, eager));
  EXPECT_TRUE(test::bit_equal(again, eager));
  const auto programs = model->compiled_programs();
  EXPECT_EQ(programs.count("Flux2TransformerBlock"), 1u);
  EXPECT_EQ(programs.count("Flux2SingleTransformerBlock"), 1u);
}

TEST(Flux2Transformer, ParametersAndRepeatedBlocks) {
  if (!test::has_fixture(std::string(kFixture) + "/transformer/config.json"))
    GTEST_SKIP() << "missing fixture";
  auto model = Flux2Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kFixture) + "/transformer"), DType::bf16);
  EXPECT_EQ(model->named_parameters().size(), 51u);  // every checkpoint tensor, no biases
  EXPECT_EQ(model->repeated_block_modules().size(), 4u);
  for (const auto& p : model->named_parameters())
    EXPECT_EQ(p.name.find(".bias"), std::string::npos) << p.name;
}

std::string load_error(const std::string& folder, DType dtype = DType::f32) {
  return test::load_error<Flux2Transformer2DModel>(folder, dtype);
}

TEST(Flux2TransformerErrors, ConfigErrorsNameTheKey) {
  if (!test::has_fixture(std::string(kFixture) + "/transformer/config.json"))
    GTEST_SKIP() << "missing fixture";
  const std::string folder = std::string(kFixture) + "/transformer";
  {
    test::EditedFolder f(folder, [](nlohmann::json& c) { c["axes_dims_rope"] = {4, 4, 4}; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("unsupported value axes_dims_rope (sum 12)"), std::string::npos) << msg;
  }
  {
    test::EditedFolder f(folder, [](nlohmann::json& c) { c.erase("num_single_layers"); });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("num_single_layers"), std::string::npos) << msg;
  }
  {
    test::EditedFolder f(folder, [](nlohmann::json& c) { c["mlp_ratio"] = 4.0; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("ff.linear_in.weight' has shape (384, 64) but the config implies (512, 64)"),
              std::string::npos)
        << msg;
  }
  {
    test::EditedFolder f(folder, [](nlohmann::json& c) { c["guidance_embeds"] = false; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("guidance_embedder"), std::string::npos) << msg;
  }
}

TEST(Flux2TransformerErrors, BadInputsAreNamed) {
  test::ComponentGolden g;
  if (!test::load_component_golden(kFixture, "transformer", DType::f32, &g))
    GTEST_SKIP() << "missing golden";
  auto model = Flux2Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kFixture) + "/transformer"), DType::f32);
  auto in = inputs_from(g.inputs);
  in.txt_ids = in.img_ids;
  const std::string msg = test::error_message([&] { model->forward(in); });
  EXPECT_NE(msg.find("one row per text and image token"), std::string::npos) << msg;
  in = inputs_from(g.inputs);
  in.hidden_states = in.encoder_hidden_states;
  EXPECT_NE(test::error_message([&] { model->forward(in); }).find("hidden_states must be"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
