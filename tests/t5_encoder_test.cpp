// T5EncoderModel against transformers goldens (tests/fixtures/goldens/<pipeline>/components/
// text_encoder_{2,3}/<dtype>/, made by reference/goldens/pipeline_flux.py and pipeline_sd3.py):
// last_hidden_state, every hidden state and every recorded intermediate (block outputs,
// self-attention sub-layer outputs, position bias), f32 and bf16; plus the relative position
// buckets, the padding mask and loading errors.
#include "models/t5_encoder.h"

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
#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

struct ParityCase {
  std::string pipeline;   // fixture folder, e.g. "flux1-schnell-tiny"
  std::string component;  // "text_encoder_2" (FLUX.1) or "text_encoder_3" (SD3)
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<ParityCase>& info) {
  std::string n =
      info.param.pipeline + "_" + info.param.component + "_" + dtype_name(info.param.dtype);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}


class T5EncoderParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(T5EncoderParity, OutputsHiddenStatesAndIntermediatesMatchTransformers) {
  const auto& p = GetParam();
  test::ComponentGolden g;
  if (!test::load_component_golden(p.pipeline, p.component, p.dtype, &g))
    GTEST_SKIP() << "missing " << p.component << " golden of " << p.pipeline;
  auto model =
      T5EncoderModel::from_pretrained(test::fixture_path(p.pipeline + "/" + p.component), p.dtype);

  std::map<std::string, Tensor> capture;
  const T5EncoderOutput out =
      model->forward(g.inputs.at("input_ids"), &capture, {.output_hidden_states = true});
  std::map<std::string, Tensor> actual = {{"last_hidden_state", out.last_hidden_state}};
  for (size_t i = 0; i < out.hidden_states.size(); ++i)
    actual["hidden_states." + std::to_string(i)] = out.hidden_states[i];
  EXPECT_EQ(actual.size(), g.outputs.size());
  test::expect_all_match(g.outputs, actual, p.dtype, "output");
  test::expect_all_match(g.intermediates, capture, p.dtype, "captured activation",
                         [&](const std::string& name, const Tensor& a, const Tensor& e) {
                           // The position bias is a table lookup: exact in both dtypes.
                           if (name.find("position_bias") != std::string::npos)
                             return test::bit_equal(contiguous(a), e);
                           return test::activations_close(a, e, p.dtype);
                         });
}

INSTANTIATE_TEST_SUITE_P(
    Goldens, T5EncoderParity,
    ::testing::Values(ParityCase{"flux1-schnell-tiny", "text_encoder_2", DType::f32},
                      ParityCase{"flux1-schnell-tiny", "text_encoder_2", DType::bf16},
                      ParityCase{"flux1-dev-tiny", "text_encoder_2", DType::f32},
                      ParityCase{"flux1-dev-tiny", "text_encoder_2", DType::bf16},
                      ParityCase{"sd35-medium-tiny", "text_encoder_3", DType::f32},
                      ParityCase{"sd35-medium-tiny", "text_encoder_3", DType::bf16}),
    case_name);

TEST(T5RelativePositionBuckets, MatchTransformersAtTheLogBucketBoundaries) {
  // Values of transformers' T5Attention._relative_position_bucket(rel, True, 32, 128) for
  // rel = memory - query, computed with torch 2.15: exact below 8, then log-spaced up to 15.
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 0},    {1, 17},    {-1, 1},   {7, 23},   {-7, 7},   {8, 24},   {-8, 8},   {15, 25},
      {-15, 9},  {16, 26},   {-16, 10}, {17, 26},  {31, 27},  {-31, 11}, {32, 28},  {-32, 12},
      {33, 28},  {63, 29},   {-63, 13}, {64, 30},  {-64, 14}, {65, 30},  {127, 31}, {-127, 15},
      {128, 31}, {-128, 15}, {129, 31}, {511, 31}, {-511, 15}};
  // One query at 600 over keys 0..1199 covers rel -600..599.
  const auto table = t5_relative_position_buckets(1, 1200, true, 32, 128);
  ASSERT_EQ(table.shape(), Shape({1, 1200}));
  const auto v = table.to_ints();
  const auto row = t5_relative_position_buckets(601, 1200, true, 32, 128).select(0, 600).to_ints();
  for (const auto& [rel, bucket] : expected) EXPECT_EQ(row[size_t(600 + rel)], bucket) << rel;
  // Query 0: rel = key index >= 0, so buckets 16.. only.
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[16], 26);
  EXPECT_EQ(v[1199], 31);
}

TEST(T5GeluNew, IsTheTanhApproximation) {
  const Tensor x = Tensor::from_floats({-3.f, -1.f, -0.25f, 0.f, 0.5f, 2.f, 6.f}, {7});
  const auto y = gelu_new(x).to_floats();
  const auto xs = x.to_floats();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], ref, 1e-6) << v;
  }
}

const char* kFluxT5 = "flux1-schnell-tiny/text_encoder_2";

TEST(T5Encoder, PaddingMaskHidesPaddedKeys) {
  // Relative position bias depends only on key - query, so with the last keys masked the other
  // rows equal a run on the unpadded prefix alone.
  if (!test::has_component(kFluxT5)) GTEST_SKIP() << "missing fixture " << kFluxT5;
  for (DType dt : {DType::f32, DType::bf16}) {
    auto model = T5EncoderModel::from_pretrained(test::fixture_path(kFluxT5), dt);
    const Tensor ids = Tensor::from_ints({21, 300, 7, 42, 1, 0, 0, 0}, {1, 8});
    const Tensor prefix = Tensor::from_ints({21, 300, 7, 42, 1}, {1, 5});
    const auto masked = model->forward(
        ids, nullptr, {.attention_mask = Tensor::from_ints({1, 1, 1, 1, 1, 0, 0, 0}, {1, 8})});
    const auto alone = model->forward(prefix);
    EXPECT_TRUE(test::activations_close(masked.last_hidden_state.slice(1, 0, 5),
                                        alone.last_hidden_state, dt))
        << dtype_name(dt);
    const auto ones = model->forward(
        ids, nullptr, {.attention_mask = Tensor::from_ints({1, 1, 1, 1, 1, 1, 1, 1}, {1, 8})});
    EXPECT_TRUE(test::bit_equal(ones.last_hidden_state, model->forward(ids).last_hidden_state));
  }
}

using test::EditedFolder;

std::string load_error(const std::string& folder, DType dtype = DType::f32) {
  return test::load_error<T5EncoderModel>(folder, dtype);
}

TEST(T5Encoder, ReadsTheTiedEmbeddingNameWhenSharedIsAbsent) {
  if (!test::has_component(kFluxT5)) GTEST_SKIP() << "missing fixture " << kFluxT5;
  EditedFolder f(
      kFluxT5, [](nlohmann::json&) {},
      [](const std::string& k) {
        return k == "shared.weight" ? std::string("encoder.embed_tokens.weight") : k;
      });
  auto a = T5EncoderModel::from_pretrained(test::fixture_path(kFluxT5), DType::f32);
  auto b = T5EncoderModel::from_pretrained(f.path(), DType::f32);
  const Tensor ids = Tensor::from_ints({21, 300, 7, 42, 1}, {1, 5});
  EXPECT_TRUE(
      test::bit_equal(b->forward(ids).last_hidden_state, a->forward(ids).last_hidden_state));
  EditedFolder none(
      kFluxT5, [](nlohmann::json&) {},
      [](const std::string& k) {
        return k == "shared.weight" ? std::string("decoder.embed_tokens.weight") : k;
      });
  const std::string msg = load_error(none.path());
  EXPECT_NE(msg.find("missing tensor 'shared.weight'"), std::string::npos) << msg;
}

TEST(T5EncoderErrors, ConfigNotMatchingWeightsNamesTensorAndBothShapes) {
  if (!test::has_component(kFluxT5)) GTEST_SKIP() << "missing fixture " << kFluxT5;
  EditedFolder f(kFluxT5, [](nlohmann::json& c) { c["d_ff"] = 48; });
  const std::string msg = load_error(f.path());
  EXPECT_NE(msg.find("'encoder.block.0.layer.1.DenseReluDense.wi_0.weight' has shape (64, 32)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the config implies (48, 32)"), std::string::npos) << msg;
}

TEST(T5EncoderErrors, MissingConfigKeyIsNamed) {
  if (!test::has_component(kFluxT5)) GTEST_SKIP() << "missing fixture " << kFluxT5;
  EditedFolder f(kFluxT5, [](nlohmann::json& c) { c.erase("d_kv"); });
  const std::string msg = load_error(f.path());
  EXPECT_NE(msg.find("d_kv"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

TEST(T5EncoderErrors, UnsupportedConfigValuesAreNamed) {
  if (!test::has_component(kFluxT5)) GTEST_SKIP() << "missing fixture " << kFluxT5;
  {
    EditedFolder f(kFluxT5, [](nlohmann::json& c) { c["feed_forward_proj"] = "gated-silu"; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("unsupported value feed_forward_proj='gated-silu'"), std::string::npos)
        << msg;
  }
  {
    EditedFolder f(kFluxT5, [](nlohmann::json& c) { c["relative_attention_num_buckets"] = 2; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("unsupported value relative_attention_num_buckets=2"), std::string::npos)
        << msg;
  }
  {
    // relu T5 has `wi`, the gated checkpoint `wi_0`/`wi_1`.
    EditedFolder f(kFluxT5, [](nlohmann::json& c) { c["feed_forward_proj"] = "relu"; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("missing tensor 'encoder.block.0.layer.1.DenseReluDense.wi.weight'"),
              std::string::npos)
        << msg;
  }
  {
    EditedFolder f(kFluxT5, [](nlohmann::json& c) { c["num_layers"] = 1; });
    const std::string msg = load_error(f.path());
    EXPECT_NE(msg.find("encoder.block.1."), std::string::npos) << msg;
    EXPECT_NE(msg.find("has no place for"), std::string::npos) << msg;
  }
  EXPECT_NE(load_error(test::fixture_path(kFluxT5), DType::f16).find("dtype f16 is not supported"),
            std::string::npos);
  EXPECT_NE(load_error("/nonexistent/text_encoder_2").find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace tessera
