// CLIPTextModel / CLIPTextModelWithProjection against transformers goldens
// (tests/fixtures/goldens/<pipeline>/components/text_encoder{,_2}/<dtype>/, made by
// reference/goldens/pipeline_flux.py and pipeline_sd3.py): every output field, every hidden state
// and every recorded intermediate, f32 and bf16; plus loading errors and the pooling rules.
#include "models/clip_text_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "component_goldens.h"
#include "edited_folder.h"
#include "io_test_folder.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

struct ParityCase {
  std::string pipeline;   // fixture folder, e.g. "flux1-schnell-tiny"
  std::string component;  // "text_encoder" or "text_encoder_2"
  bool with_projection;   // CLIPTextModelWithProjection (SD3) or CLIPTextModel (FLUX.1)
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<ParityCase>& info) {
  std::string n =
      info.param.pipeline + "_" + info.param.component + "_" + dtype_name(info.param.dtype);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}


CLIPTextOutput run(const ParityCase& p, const Tensor& ids, std::map<std::string, Tensor>* capture,
                   const CLIPTextForwardOptions& opt) {
  const std::string folder = test::fixture_path(p.pipeline + "/" + p.component);
  if (p.with_projection)
    return CLIPTextModelWithProjection::from_pretrained(folder, p.dtype)
        ->forward(ids, capture, opt);
  return CLIPTextModel::from_pretrained(folder, p.dtype)->forward(ids, capture, opt);
}

class CLIPTextParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(CLIPTextParity, OutputsHiddenStatesAndIntermediatesMatchTransformers) {
  const auto& p = GetParam();
  test::ComponentGolden g;
  if (!test::load_component_golden(p.pipeline, p.component, p.dtype, &g))
    GTEST_SKIP() << "missing " << p.component << " golden of " << p.pipeline;

  std::map<std::string, Tensor> capture;
  const CLIPTextOutput out =
      run(p, g.inputs.at("input_ids"), &capture, {.output_hidden_states = true});
  std::map<std::string, Tensor> actual = {{"last_hidden_state", out.last_hidden_state},
                                          {"pooler_output", out.pooler_output}};
  if (p.with_projection) actual["text_embeds"] = out.text_embeds;
  for (size_t i = 0; i < out.hidden_states.size(); ++i)
    actual["hidden_states." + std::to_string(i)] = out.hidden_states[i];
  test::expect_all_match(g.outputs, actual, p.dtype, "output");
  const size_t golden_hidden =
      size_t(std::count_if(g.outputs.begin(), g.outputs.end(), [](const auto& kv) {
        return kv.first.rfind("hidden_states.", 0) == 0;
      }));
  EXPECT_EQ(out.hidden_states.size(), golden_hidden);
  test::expect_all_match(g.intermediates, capture, p.dtype, "captured activation");
  EXPECT_EQ(capture.size(), g.intermediates.size());
}

INSTANTIATE_TEST_SUITE_P(
    Goldens, CLIPTextParity,
    ::testing::Values(ParityCase{"flux1-schnell-tiny", "text_encoder", false, DType::f32},
                      ParityCase{"flux1-schnell-tiny", "text_encoder", false, DType::bf16},
                      ParityCase{"flux1-dev-tiny", "text_encoder", false, DType::f32},
                      ParityCase{"flux1-dev-tiny", "text_encoder", false, DType::bf16},
                      ParityCase{"sd35-medium-tiny", "text_encoder", true, DType::f32},
                      ParityCase{"sd35-medium-tiny", "text_encoder", true, DType::bf16},
                      ParityCase{"sd35-medium-tiny", "text_encoder_2", true, DType::f32},
                      ParityCase{"sd35-medium-tiny", "text_encoder_2", true, DType::bf16}),
    case_name);

using test::EditedFolder;

const char* kFluxClip = "flux1-schnell-tiny/text_encoder";
const char* kSd3ClipG = "sd35-medium-tiny/text_encoder_2";

TEST(CLIPTextErrors, ConfigNotMatchingWeightsNamesTensorAndBothShapes) {
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  EditedFolder f(kFluxClip, [](nlohmann::json& c) { c["intermediate_size"] = 48; });
  const std::string msg = test::load_error<CLIPTextModel>(f.path());
  EXPECT_NE(msg.find("'text_model.encoder.layers.0.mlp.fc1.weight' has shape (64, 16)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the config implies (48, 16)"), std::string::npos) << msg;
}

TEST(CLIPTextErrors, MissingConfigKeyIsNamed) {
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  EditedFolder f(kFluxClip, [](nlohmann::json& c) { c.erase("hidden_size"); });
  const std::string msg = test::load_error<CLIPTextModel>(f.path());
  EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

TEST(CLIPTextErrors, UnsupportedConfigValuesAreNamed) {
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  {
    EditedFolder f(kFluxClip, [](nlohmann::json& c) { c["hidden_act"] = "swiglu"; });
    const std::string msg = test::load_error<CLIPTextModel>(f.path());
    EXPECT_NE(msg.find("unsupported value hidden_act='swiglu'"), std::string::npos) << msg;
  }
  {
    EditedFolder f(kFluxClip, [](nlohmann::json& c) { c["num_attention_heads"] = 3; });
    const std::string msg = test::load_error<CLIPTextModel>(f.path());
    EXPECT_NE(msg.find("unsupported value num_attention_heads=3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hidden_size=16"), std::string::npos) << msg;
  }
  {
    EditedFolder f(kFluxClip, [](nlohmann::json& c) { c["model_type"] = "t5"; });
    const std::string msg = test::load_error<CLIPTextModel>(f.path());
    EXPECT_NE(msg.find("unsupported value model_type='t5'"), std::string::npos) << msg;
  }
  EXPECT_NE(test::load_error<CLIPTextModel>(test::fixture_path(kFluxClip), DType::f16)
                .find("dtype f16 is not supported"),
            std::string::npos);
  EXPECT_NE(test::load_error<CLIPTextModel>("/nonexistent/text_encoder").find("does not exist"),
            std::string::npos);
}

TEST(CLIPTextErrors, ProjectionIsRequiredWithProjectionAndRefusedWithout) {
  if (!test::has_component(kFluxClip) || !test::has_component(kSd3ClipG)) GTEST_SKIP() << "missing CLIP fixtures";
  // CLIPTextModel weights have no text_projection.
  const std::string missing =
      test::load_error<CLIPTextModelWithProjection>(test::fixture_path(kFluxClip));
  EXPECT_NE(missing.find("missing tensor 'text_projection.weight'"), std::string::npos) << missing;
  // CLIPTextModelWithProjection weights have one CLIPTextModel has no place for.
  const std::string extra = test::load_error<CLIPTextModel>(test::fixture_path(kSd3ClipG));
  EXPECT_NE(extra.find("text_projection.weight"), std::string::npos) << extra;
  EXPECT_NE(extra.find("has no place for"), std::string::npos) << extra;
}

TEST(CLIPText, LoadsWeightsWithoutTheTextModelPrefix) {
  // transformers 5 writes CLIPTextModel weights without `text_model.`; it reads both forms.
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  EditedFolder bare(
      kFluxClip, [](nlohmann::json&) {},
      [](const std::string& k) { return k.substr(std::string("text_model.").size()); });
  auto a = CLIPTextModel::from_pretrained(test::fixture_path(kFluxClip), DType::f32);
  auto b = CLIPTextModel::from_pretrained(bare.path(), DType::f32);
  const Tensor ids = Tensor::from_ints({49406, 320, 1125, 539, 49407, 49407}, {1, 6});
  EXPECT_TRUE(
      test::bit_equal(b->forward(ids).last_hidden_state, a->forward(ids).last_hidden_state));
}

TEST(CLIPText, PoolsAtTheFirstEosTokenUnlessTheLegacyIdIs2) {
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  // Row 0: 49407 at 3 and 5, id 5 at 2; row 1: neither (transformers then takes index 0).
  const Tensor ids = Tensor::from_ints({49406, 49406, 5, 49407, 7, 49407,  //
                                        49406, 10, 11, 12, 13, 14},
                                       {2, 6});
  {
    auto legacy = CLIPTextModel::from_pretrained(test::fixture_path(kFluxClip), DType::f32);
    ASSERT_EQ(legacy->config().eos_token_id, 2);
    const auto out = legacy->forward(ids);
    // argmax(input_ids): the first largest id, row 0 at 3, row 1 at 0.
    EXPECT_TRUE(test::bit_equal(out.pooler_output.select(0, 0),
                                out.last_hidden_state.select(0, 0).select(0, 3)));
    EXPECT_TRUE(test::bit_equal(out.pooler_output.select(0, 1),
                                out.last_hidden_state.select(0, 1).select(0, 0)));
  }
  EditedFolder f(kFluxClip, [](nlohmann::json& c) { c["eos_token_id"] = 5; });
  auto model = CLIPTextModel::from_pretrained(f.path(), DType::f32);
  const auto out = model->forward(ids);
  // First id equal to 5: row 0 at 2; row 1 has none, so index 0.
  EXPECT_TRUE(test::bit_equal(out.pooler_output.select(0, 0),
                              out.last_hidden_state.select(0, 0).select(0, 2)));
  EXPECT_TRUE(test::bit_equal(out.pooler_output.select(0, 1),
                              out.last_hidden_state.select(0, 1).select(0, 0)));
}

TEST(CLIPText, PaddingMaskOfOnesChangesNothingAndRightPaddingKeepsThePrefix) {
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  auto model = CLIPTextModel::from_pretrained(test::fixture_path(kFluxClip), DType::f32);
  const Tensor ids = Tensor::from_ints({49406, 320, 1125, 49407, 49407, 49407}, {1, 6});
  const auto plain = model->forward(ids);
  const auto ones = model->forward(
      ids, nullptr, {.attention_mask = Tensor::from_ints({1, 1, 1, 1, 1, 1}, {1, 6})});
  EXPECT_TRUE(test::all_close(ones.last_hidden_state, plain.last_hidden_state, 0, 1e-6));
  EXPECT_TRUE(plain.hidden_states.empty());  // only with output_hidden_states
  EXPECT_FALSE(plain.text_embeds.defined());
  // Causal attention already hides later keys from the first four queries.
  const auto padded = model->forward(
      ids, nullptr, {.attention_mask = Tensor::from_ints({1, 1, 1, 1, 0, 0}, {1, 6})});
  EXPECT_TRUE(test::all_close(padded.last_hidden_state.slice(1, 0, 4),
                              plain.last_hidden_state.slice(1, 0, 4), 0, 1e-6));
}

TEST(CLIPText, InputErrorsAreNamed) {
  if (!test::has_component(kFluxClip)) GTEST_SKIP() << "missing fixture " << kFluxClip;
  auto model = CLIPTextModel::from_pretrained(test::fixture_path(kFluxClip), DType::f32);
  auto error = [&](const Tensor& ids) {
    try {
      model->forward(ids);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(Tensor::zeros({1, 78}, DType::i64)).find("max_position_embeddings=77"),
            std::string::npos);
  EXPECT_NE(error(Tensor::zeros({1, 5}, DType::f32)).find("input_ids must be (B, L) i64"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
