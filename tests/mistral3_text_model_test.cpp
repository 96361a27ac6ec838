// The Mistral3 language model (FLUX.2's text encoder) against transformers goldens
// (tests/fixtures/goldens/flux2-dev-tiny/components/text_encoder/<dtype>/): every recorded
// hidden state and intermediate, the stacked prompt embeddings, left padding; plus errors.
#include "models/mistral3_text_model.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "component_goldens.h"
#include "edited_folder.h"
#include "mistral3_tolerance.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kFolder = "flux2-dev-tiny/text_encoder";

class Mistral3Parity : public ::testing::TestWithParam<DType> {};

TEST_P(Mistral3Parity, HiddenStatesAndIntermediatesMatchTransformers) {
  const DType dtype = GetParam();
  test::ComponentGolden g;
  if (!test::load_component_golden("flux2-dev-tiny", "text_encoder", dtype, &g))
    GTEST_SKIP() << "missing text_encoder golden";
  auto model = Mistral3TextModel::from_pretrained(test::fixture_path(kFolder), dtype);
  std::map<std::string, Tensor> capture;
  const Mistral3TextOutput o =
      model->forward(g.inputs.at("input_ids"), g.inputs.at("attention_mask"), -1, &capture);
  ASSERT_EQ(o.hidden_states.size(), 33u);
  std::map<std::string, Tensor> outputs;
  for (size_t i = 0; i < o.hidden_states.size(); ++i)
    outputs["hidden_states." + std::to_string(i)] = o.hidden_states[i];
  outputs["prompt_embeds"] =
      model->prompt_embeds(g.inputs.at("input_ids"), g.inputs.at("attention_mask"), {10, 20, 30});
  const auto cmp = [&](const std::string&, const Tensor& a, const Tensor& e) {
    return test::text_encoder_close(a, e, dtype);
  };
  test::expect_all_match(g.outputs, outputs, dtype, "output", cmp);
  test::expect_all_match(g.intermediates, capture, dtype, "captured activation", cmp);
}

INSTANTIATE_TEST_SUITE_P(Goldens, Mistral3Parity, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The pipeline's prompt embeddings stop after layer 30 and equal the full run's bits.
TEST(Mistral3TextModel, PromptEmbedsStopEarlyAndMatchTheFullRun) {
  test::ComponentGolden g;
  if (!test::load_component_golden("flux2-dev-tiny", "text_encoder", DType::f32, &g))
    GTEST_SKIP() << "missing text_encoder golden";
  auto model = Mistral3TextModel::from_pretrained(test::fixture_path(kFolder), DType::f32);
  const auto full = model->forward(g.inputs.at("input_ids"), g.inputs.at("attention_mask"));
  const auto part = model->forward(g.inputs.at("input_ids"), g.inputs.at("attention_mask"), 30);
  ASSERT_EQ(part.hidden_states.size(), 31u);
  EXPECT_TRUE(test::bit_equal(part.hidden_states[30], full.hidden_states[30]));
  EXPECT_TRUE(test::bit_equal(part.hidden_states[10], full.hidden_states[10]));
}

TEST(Mistral3TextModel, RegionalCompileIsBitEqualToEager) {
  test::ComponentGolden g;
  if (!test::load_component_golden("flux2-dev-tiny", "text_encoder", DType::bf16, &g))
    GTEST_SKIP() << "missing text_encoder golden";
  auto model = Mistral3TextModel::from_pretrained(test::fixture_path(kFolder), DType::bf16);
  model->reset_compile();
  const Tensor eager =
      model->prompt_embeds(g.inputs.at("input_ids"), g.inputs.at("attention_mask"), {10, 20, 30});
  model->compile_repeated_blocks();
  const Tensor compiled =
      model->prompt_embeds(g.inputs.at("input_ids"), g.inputs.at("attention_mask"), {10, 20, 30});
  EXPECT_TRUE(test::bit_equal(compiled, eager));
  EXPECT_EQ(model->compiled_programs().count("MistralDecoderLayer"), 1u);
}

// compile(): the whole forward (embedding, the layers the call runs, norm) as one program.
TEST(Mistral3TextModel, WholeCompileIsBitEqualToEager) {
  test::ComponentGolden g;
  if (!test::load_component_golden("flux2-dev-tiny", "text_encoder", DType::bf16, &g))
    GTEST_SKIP() << "missing text_encoder golden";
  auto model = Mistral3TextModel::from_pretrained(test::fixture_path(kFolder), DType::bf16);
  model->reset_compile();
  const auto eager = model->forward(g.inputs.at("input_ids"), g.inputs.at("attention_mask"));
  model->compile();
  const auto compiled = model->forward(g.inputs.at("input_ids"), g.inputs.at("attention_mask"));
  ASSERT_EQ(compiled.hidden_states.size(), eager.hidden_states.size());
  for (size_t i = 0; i < eager.hidden_states.size(); ++i)
    EXPECT_TRUE(test::bit_equal(compiled.hidden_states[i], eager.hidden_states[i])) << i;
  EXPECT_EQ(model->compiled_programs().size(), 1u);
}

TEST(Mistral3TextModelErrors, ConfigAndInputErrorsAreNamed) {
  if (!test::has_fixture(std::string(kFolder) + "/config.json")) GTEST_SKIP() << "missing fixture";
  {
    test::EditedFolder f(kFolder, [](nlohmann::json& c) {
      c["text_config"]["rope_parameters"]["rope_type"] = "yarn";
    });
    const std::string msg = test::load_error<Mistral3TextModel>(f.path());
    EXPECT_NE(msg.find("unsupported value rope_type='yarn'"), std::string::npos) << msg;
  }
  {
    test::EditedFolder f(kFolder,
                         [](nlohmann::json& c) { c["text_config"]["sliding_window"] = 8; });
    const std::string msg = test::load_error<Mistral3TextModel>(f.path());
    EXPECT_NE(msg.find("sliding_window=8"), std::string::npos) << msg;
  }
  {
    test::EditedFolder f(kFolder,
                         [](nlohmann::json& c) { c["text_config"]["num_key_value_heads"] = 3; });
    const std::string msg = test::load_error<Mistral3TextModel>(f.path());
    EXPECT_NE(msg.find("num_key_value_heads=3"), std::string::npos) << msg;
  }
  auto model = Mistral3TextModel::from_pretrained(test::fixture_path(kFolder), DType::f32);
  const Tensor ids = Tensor::from_ints({1, 2, 3}, {1, 3});
  EXPECT_NE(test::error_message([&] {
              model->prompt_embeds(ids, Tensor(), {10, 40});
            }).find("hidden_states[40] does not exist"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              model->forward(ids, Tensor::from_ints({1, 1}, {1, 2}));
            }).find("attention_mask must be"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
