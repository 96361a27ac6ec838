// SD3Transformer2DModel against diffusers goldens (tests/fixtures/goldens/sd35-medium-tiny/
// components/transformer/<dtype>/): the output and every recorded intermediate (dual-attention
// blocks, the context_pre_only last block), f32 and bf16; the position table; skip_layers; errors.
#include "models/sd3_transformer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "component_goldens.h"
#include "edited_folder.h"
#include "io/safetensors.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kSd3 = "sd35-medium-tiny";

SD3TransformerInputs inputs_from(const std::map<std::string, Tensor>& t) {
  return {t.at("hidden_states"),
          t.at("encoder_hidden_states"),
          t.at("pooled_projections"),
          t.at("timestep"),
          {}};
}

bool have_tiny() {
  return test::has_component(std::string(kSd3) + "/transformer");
}

class SD3TransformerParity : public ::testing::TestWithParam<DType> {};

TEST_P(SD3TransformerParity, OutputAndEveryIntermediateMatchDiffusers) {
  const DType dtype = GetParam();
  test::ComponentGolden g;
  if (!test::load_component_golden(kSd3, "transformer", dtype, &g))
    GTEST_SKIP() << "missing transformer golden of " << kSd3;
  auto model = SD3Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kSd3) + "/transformer"), dtype);
  std::map<std::string, Tensor> capture;
  const Tensor sample = model->forward(inputs_from(g.inputs), &capture);
  test::expect_all_match(g.outputs, {{"sample", sample}}, dtype, "output");
  test::expect_all_match(g.intermediates, capture, dtype, "captured activation");
  EXPECT_EQ(capture.size(), g.intermediates.size());
}

INSTANTIATE_TEST_SUITE_P(Goldens, SD3TransformerParity, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(SD3Transformer, BlocksParametersAndRepeatedBlockClass) {
  if (!have_tiny()) GTEST_SKIP() << "missing fixture " << kSd3;
  auto model = SD3Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kSd3) + "/transformer"), DType::bf16);
  ASSERT_EQ(model->transformer_blocks.size(), 4u);
  EXPECT_TRUE(model->transformer_blocks[0]->use_dual_attention);
  EXPECT_TRUE(model->transformer_blocks[1]->use_dual_attention);
  EXPECT_FALSE(model->transformer_blocks[2]->use_dual_attention);
  EXPECT_TRUE(model->transformer_blocks[3]->context_pre_only);
  EXPECT_FALSE(model->transformer_blocks[3]->attn.to_add_out);
  // 159 tensors in the checkpoint, every one used (the position table included).
  EXPECT_EQ(model->named_parameters().size(), 159u);
  EXPECT_EQ(model->pos_embed.pos_embed.dtype(), DType::bf16);
  // One block class for every layer: what regional compilation and sequential offload use.
  EXPECT_EQ(model->repeated_blocks(), std::vector<std::string>{"JointTransformerBlock"});
  EXPECT_EQ(model->repeated_block_modules().size(), 4u);
}

// The table diffusers computes at construction and saves: ours equals the checkpoint's (stored in
// bf16) to bf16 rounding, and is used when a checkpoint lacks it.
TEST(SD3Transformer, PositionTableMatchesTheSavedBuffer) {
  if (!have_tiny()) GTEST_SKIP() << "missing fixture " << kSd3;
  auto model = SD3Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kSd3) + "/transformer"), DType::f32);
  const auto& c = model->config;
  const Tensor table =
      nn::sincos_pos_embed_2d(c.inner_dim(), c.pos_embed_max_size, c.sample_size / c.patch_size);
  const Tensor saved = model->pos_embed.pos_embed;
  ASSERT_EQ(saved.shape(), (Shape{1, 256, 32}));
  EXPECT_TRUE(test::all_close(table.view({1, 256, 32}), saved, 8e-3, 1e-6));
  // Without the buffer, the computed table's crop is used.
  model->pos_embed.pos_embed = Tensor();
  const Tensor crop = model->pos_embed.cropped_pos_embed(3, 5);
  EXPECT_EQ(crop.shape(), (Shape{1, 15, 32}));
  // Row 0 of the 3x5 crop of the 16x16 grid is grid position (6, 5).
  const auto t = table.to_floats(), cr = crop.to_floats();
  for (int k = 0; k < 32; ++k) EXPECT_EQ(cr[size_t(k)], t[size_t((6 * 16 + 5) * 32 + k)]);
}

// Skip-layer guidance: a skipped block is not run, and the next block runs on what the skipped
// one was given.
TEST(SD3Transformer, SkipLayersRunTheOtherBlocks) {
  const std::string golden = "goldens/sd35-medium-tiny/components/transformer/f32/";
  if (!test::has_fixture(golden + "inputs.safetensors")) GTEST_SKIP() << "missing " << golden;
  auto model = SD3Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kSd3) + "/transformer"), DType::f32);
  auto in = inputs_from(test::load_fixture(golden + "inputs.safetensors"));
  const Tensor full = model->forward(in);
  in.skip_layers = {0};
  std::map<std::string, Tensor> cap;
  const Tensor skipped = model->forward(in, &cap);
  EXPECT_EQ(cap.count("transformer_blocks.0.hidden_states"), 0u);
  EXPECT_FALSE(test::all_close(skipped, full, 1e-3, 1e-3));
  const auto out = (*model->transformer_blocks[1])(cap.at("pos_embed"), cap.at("context_embedder"),
                                                   cap.at("time_text_embed"));
  EXPECT_TRUE(test::bit_equal(out.hidden_states, cap.at("transformer_blocks.1.hidden_states")));
  in.skip_layers = {4};
  EXPECT_NE(test::error_message([&] { model->forward(in); }).find("skip_layers names layer 4"),
            std::string::npos);
}

// diffusers declares no repeated blocks for SD3 (compile_repeated_blocks raises); here the one
// block class compiles to one program per variant (dual attention, plain, context_pre_only),
// bit-identical to eager; a whole-model program per skip set.
TEST(SD3Transformer, RegionalAndWholeCompile) {
  const std::string golden = "goldens/sd35-medium-tiny/components/transformer/bf16/";
  if (!test::has_fixture(golden + "inputs.safetensors")) GTEST_SKIP() << "missing " << golden;
  auto model = SD3Transformer2DModel::from_pretrained(
      test::fixture_path(std::string(kSd3) + "/transformer"), DType::bf16);
  model->reset_compile();  // eager reference, whatever TESSERA_COMPILE says
  auto in = inputs_from(test::load_fixture(golden + "inputs.safetensors"));
  const Tensor ref = model->forward(in);
  model->compile_repeated_blocks();
  reset_mode_stats();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(test::bit_equal(model->forward(in), ref));
  EXPECT_EQ(model->compiled_programs().at("JointTransformerBlock"), 3);
  EXPECT_EQ(mode_stats().program_compiles, 3);
  model->reset_compile();
  model->compile();
  EXPECT_TRUE(test::bit_equal(model->forward(in), ref));
  in.skip_layers = {2};
  const Tensor skipped = model->forward(in);
  EXPECT_EQ(model->compiled_programs().at("SD3Transformer2DModel"), 2);
  model->reset_compile();
  EXPECT_TRUE(test::bit_equal(model->forward(in), skipped));
}

// The published SD3.5 transformer configs (as tools/make_synthetic_checkpoint writes them) build
// from the same code: 2.47B parameters for medium (13 dual-attention blocks, the position table
// of 384^2 included: 4.94 GB in bf16) and 8.15B for large (no dual attention; the model card's
// "8B").
TEST(SD3Transformer, PublishedConfigsBuild) {
  auto build = [](const char* text) {
    return SD3Transformer2DModel(
        SD3TransformerConfig::from_json(JsonConfig::from_json(nlohmann::json::parse(text), "cfg")));
  };
  const SD3Transformer2DModel medium = build(R"({"attention_head_dim": 64,
      "caption_projection_dim": 1536, "dual_attention_layers": [0,1,2,3,4,5,6,7,8,9,10,11,12],
      "in_channels": 16, "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 24,
      "out_channels": 16, "patch_size": 2, "pooled_projection_dim": 2048,
      "pos_embed_max_size": 384, "qk_norm": "rms_norm", "sample_size": 128})");
  EXPECT_NEAR(double(medium.parameter_count()) / 1e9, 2.47, 0.01);
  EXPECT_TRUE(medium.transformer_blocks[12]->use_dual_attention);
  EXPECT_FALSE(medium.transformer_blocks[13]->use_dual_attention);
  const SD3Transformer2DModel large = build(R"({"attention_head_dim": 64,
      "caption_projection_dim": 2432, "dual_attention_layers": [], "in_channels": 16,
      "joint_attention_dim": 4096, "num_attention_heads": 38, "num_layers": 38, "out_channels": 16,
      "patch_size": 2, "pooled_projection_dim": 2048, "pos_embed_max_size": 192,
      "qk_norm": "rms_norm", "sample_size": 128})");
  EXPECT_NEAR(double(large.parameter_count()) / 1e9, 8.15, 0.01);
  EXPECT_TRUE(large.transformer_blocks.back()->context_pre_only);
  std::cout << "  medium " << medium.parameter_count() << ", large " << large.parameter_count()
            << " parameters\n";
}

TEST(SD3TransformerErrors, ConfigAndInputsAreChecked) {
  if (!have_tiny()) GTEST_SKIP() << "missing fixture " << kSd3;
  const std::string comp = std::string(kSd3) + "/transformer";
  {
    test::EditedFolder f(comp, [](nlohmann::json& c) { c["qk_norm"] = "layer_norm"; });
    const std::string msg = test::load_error<SD3Transformer2DModel>(f.path(), DType::f32);
    EXPECT_NE(msg.find("unsupported value qk_norm='layer_norm'"), std::string::npos) << msg;
  }
  {
    test::EditedFolder f(comp, [](nlohmann::json& c) { c.erase("num_layers"); });
    const std::string msg = test::load_error<SD3Transformer2DModel>(f.path(), DType::f32);
    EXPECT_NE(msg.find("num_layers"), std::string::npos) << msg;
  }
  {
    // A config without block 1's dual attention does not describe its weights.
    test::EditedFolder f(comp, [](nlohmann::json& c) { c["dual_attention_layers"] = {0}; });
    const std::string msg = test::load_error<SD3Transformer2DModel>(f.path(), DType::f32);
    EXPECT_NE(msg.find("transformer_blocks.1."), std::string::npos) << msg;
  }
  {
    test::EditedFolder f(comp, [](nlohmann::json& c) { c["caption_projection_dim"] = 48; });
    const std::string msg = test::load_error<SD3Transformer2DModel>(f.path(), DType::f32);
    EXPECT_NE(msg.find("caption_projection_dim=48"), std::string::npos) << msg;
  }
  auto model = SD3Transformer2DModel::from_pretrained(test::fixture_path(comp), DType::f32);
  SD3TransformerInputs in;
  in.hidden_states = Tensor::zeros({1, 16, 6, 5}, DType::f32);  // odd width
  in.encoder_hidden_states = Tensor::zeros({1, 4, 32}, DType::f32);
  in.pooled_projections = Tensor::zeros({1, 20}, DType::f32);
  in.timestep = Tensor::zeros({1}, DType::f32);
  EXPECT_NE(test::error_message([&] { model->forward(in); }).find("multiples of patch_size"),
            std::string::npos);
  in.hidden_states = Tensor::zeros({1, 16, 34, 6}, DType::f32);  // 17 patches > 16
  EXPECT_NE(test::error_message([&] { model->forward(in); }).find("pos_embed_max_size"),
            std::string::npos);
  in.hidden_states = Tensor::zeros({1, 16, 6, 6}, DType::f32);
  in.pooled_projections = Tensor::zeros({1, 8}, DType::f32);
  EXPECT_NE(test::error_message([&] { model->forward(in); }).find("pooled_projections must be"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
