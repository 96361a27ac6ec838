// The committed FLUX.1 tiny pipelines and their goldens (reference/goldens/pipeline_flux.py) are
// readable through io/ and hold the documented tensor names, dtypes and shapes, so the model and
// pipeline parity tests can rely on them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::fixture_path;
using test::has_fixture;

struct Variant {
  const char* name;
  bool guidance_embeds;
  double shift;
  bool dynamic_shifting;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

const Variant kVariants[] = {{"flux1-schnell-tiny", false, 1.0, false},
                             {"flux1-dev-tiny", true, 3.0, true}};

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

std::set<std::string> keys_of(const std::map<std::string, Tensor>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

std::string golden_dir(const Variant& v) {
  return std::string("goldens/") + v.name;
}

class FluxFixtures : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    if (!has_fixture(GetParam().name) || !has_fixture(golden_dir(GetParam()) + "/index.json"))
      GTEST_SKIP() << "fixture " << GetParam().name
                   << " not generated (reference/make_fixtures.py --only pipeline_flux)";
  }
  std::string model_path() const { return fixture_path(GetParam().name); }
};

TEST_P(FluxFixtures, PipelineFolderHasPublishedLayout) {
  const PipelineFolder p = open_pipeline_folder(model_path());
  EXPECT_EQ(p.class_name, "FluxPipeline");
  const std::map<std::string, std::string> classes = {
      {"scheduler", "FlowMatchEulerDiscreteScheduler"},
      {"text_encoder", "CLIPTextModel"},
      {"text_encoder_2", "T5EncoderModel"},
      {"tokenizer", "CLIPTokenizer"},
      {"tokenizer_2", "T5TokenizerFast"},
      {"transformer", "FluxTransformer2DModel"},
      {"vae", "AutoencoderKL"}};
  for (const auto& [name, cls] : classes) {
    ASSERT_TRUE(p.has_component(name)) << name;
    const ComponentInfo& c = p.component(name);
    EXPECT_TRUE(c.present) << name;
    EXPECT_EQ(c.class_name, cls) << name;
  }
  auto has_file = [&](const std::string& comp, const std::string& file) {
    const auto& f = p.component(comp).files;
    return std::find(f.begin(), f.end(), file) != f.end();
  };
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    EXPECT_TRUE(has_file("tokenizer", f)) << "tokenizer/" << f;
  for (const char* f : {"spiece.model", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(has_file("tokenizer_2", f)) << "tokenizer_2/" << f;
  EXPECT_TRUE(has_file("scheduler", "scheduler_config.json"));
}

TEST_P(FluxFixtures, SchedulerAndVaeConfigsArePublishedValues) {
  const PipelineFolder p = open_pipeline_folder(model_path());
  const JsonConfig s = p.component("scheduler").config();
  EXPECT_EQ(s.get_float("shift"), GetParam().shift);
  EXPECT_EQ(s.get_bool("use_dynamic_shifting"), GetParam().dynamic_shifting);
  EXPECT_EQ(s.get_int("base_image_seq_len"), 256);
  EXPECT_EQ(s.get_int("max_image_seq_len"), 4096);
  EXPECT_EQ(s.get_float("base_shift"), 0.5);
  EXPECT_EQ(s.get_float("max_shift"), 1.15);
  EXPECT_EQ(s.get_int("num_train_timesteps"), 1000);

  const JsonConfig vae = p.component("vae").config();
  EXPECT_EQ(vae.get_int("latent_channels"), 16);
  EXPECT_EQ(vae.get_float("scaling_factor"), 0.3611);
  EXPECT_EQ(vae.get_float("shift_factor"), 0.1159);
  EXPECT_FALSE(vae.get_bool("use_quant_conv"));
  EXPECT_FALSE(vae.get_bool("use_post_quant_conv"));
  EXPECT_EQ(vae.get_int_list("block_out_channels").size(), 4u);  // vae_scale_factor 8

  const JsonConfig tr = p.component("transformer").config();
  EXPECT_EQ(tr.get_bool("guidance_embeds"), GetParam().guidance_embeds);
  int64_t axes = 0;
  for (int64_t a : tr.get_int_list("axes_dims_rope")) axes += a;
  EXPECT_EQ(axes, tr.get_int("attention_head_dim"));
  EXPECT_GT(tr.get_int("num_attention_heads"), 1);
}

// Every component's weights open through the checkpoint reader (sharded where published so),
// are bf16, and the tensors the models are built from have the shapes their configs imply.
TEST_P(FluxFixtures, ComponentWeightsLoad) {
  const PipelineFolder p = open_pipeline_folder(model_path());
  const JsonConfig te = p.component("text_encoder").config();
  const JsonConfig t5 = p.component("text_encoder_2").config();
  const JsonConfig tr = p.component("transformer").config();
  const int64_t inner = tr.get_int("num_attention_heads") * tr.get_int("attention_head_dim");
  const std::map<std::string, std::map<std::string, Shape>> expected = {
      {"text_encoder",
       {{"text_model.embeddings.token_embedding.weight",
         {te.get_int("vocab_size"), te.get_int("hidden_size")}},
        {"text_model.embeddings.position_embedding.weight",
         {te.get_int("max_position_embeddings"), te.get_int("hidden_size")}},
        {"text_model.final_layer_norm.weight", {te.get_int("hidden_size")}}}},
      {"text_encoder_2",
       {{"shared.weight", {t5.get_int("vocab_size"), t5.get_int("d_model")}},
        {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
         {t5.get_int("relative_attention_num_buckets"), t5.get_int("num_heads")}},
        {"encoder.final_layer_norm.weight", {t5.get_int("d_model")}}}},
      {"transformer",
       {{"x_embedder.weight", {inner, tr.get_int("in_channels")}},
        {"context_embedder.weight", {inner, tr.get_int("joint_attention_dim")}},
        {"transformer_blocks.0.attn.to_q.weight", {inner, inner}},
        {"single_transformer_blocks.0.proj_out.weight", {inner, 5 * inner}},
        {"proj_out.weight", {tr.get_int("in_channels"), inner}}}},
      {"vae",
       {{"decoder.conv_in.weight", {32, 16, 3, 3}},
        {"encoder.conv_out.weight", {32, 32, 3, 3}},
        {"decoder.up_blocks.3.resnets.2.conv2.weight", {8, 8, 3, 3}}}},
  };
  for (const auto& [name, shapes] : expected) {
    SCOPED_TRACE(name);
    const ComponentInfo& c = p.component(name);
    ASSERT_FALSE(c.weights_path.empty());
    const CheckpointReader ck = CheckpointReader::open(c.path);
    EXPECT_EQ(ck.sharded(), name == "transformer" || name == "text_encoder_2");
    if (ck.sharded()) {
      EXPECT_GT(ck.shard_paths().size(), 1u);
      // The index's total_size is the sum of the tensor bytes.
      const json idx = read_json(ck.path());
      EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), ck.summary().bytes);
      // Reading each shard on its own gives exactly the indexed names.
      std::set<std::string> from_shards;
      for (const auto& shard : ck.shard_paths())
        for (const auto& k : keys_of(load_safetensors(shard))) from_shards.insert(k);
      EXPECT_EQ(from_shards, std::set<std::string>(ck.names().begin(), ck.names().end()));
    }
    const CheckpointSummary sum = ck.summary();
    EXPECT_EQ(sum.dtype_counts.size(), 1u) << sum.dtypes_str();
    EXPECT_EQ(sum.dtype_counts.count(DType::bf16), 1u) << sum.dtypes_str();
    for (const auto& n : ck.names()) {
      const Tensor t = ck.get(n);
      EXPECT_EQ(t.dtype(), DType::bf16) << n;
      EXPECT_TRUE(std::isfinite(t.to_floats()[0])) << n;
    }
    for (const auto& [tensor, shape] : shapes) {
      ASSERT_TRUE(ck.contains(tensor)) << tensor;
      EXPECT_EQ(ck.get(tensor).shape(), shape) << tensor;
    }
  }
  const CheckpointReader trw = CheckpointReader::open(p.component("transformer").path);
  EXPECT_EQ(trw.contains("time_text_embed.guidance_embedder.linear_1.weight"),
            GetParam().guidance_embeds);
}

// Names, dtypes and shapes of a golden file agree with its manifest.json entry.
void expect_matches_manifest(const std::string& file, const json& listed, DType float_dtype,
                             const std::set<std::string>& f32_always = {}) {
  SCOPED_TRACE(file);
  const auto tensors = test::load_fixture(file);
  std::set<std::string> names;
  for (const auto& [k, v] : listed.items()) names.insert(k);
  EXPECT_EQ(keys_of(tensors), names);
  for (const auto& [k, t] : tensors) {
    if (!listed.contains(k)) continue;
    EXPECT_EQ(t.shape(), listed[k]["shape"].get<Shape>()) << k;
    if (is_floating(t.dtype()))
      EXPECT_EQ(t.dtype(), f32_always.count(k) ? DType::f32 : float_dtype) << k;
  }
}

TEST_P(FluxFixtures, ComponentGoldensHaveDocumentedNames) {
  const std::string dir = golden_dir(GetParam());
  const json index = read_json(fixture_path(dir + "/index.json"));
  const int n = 2;  // double and single blocks in the tiny transformer
  std::map<std::string, std::vector<std::string>> required = {
      {"text_encoder",
       {"inputs:input_ids", "outputs:last_hidden_state", "outputs:pooler_output",
        "outputs:hidden_states.0", "outputs:hidden_states.2", "intermediates:text_model.embeddings",
        "intermediates:text_model.encoder.layers.1", "intermediates:text_model.final_layer_norm"}},
      {"text_encoder_2",
       {"inputs:input_ids", "outputs:last_hidden_state", "outputs:hidden_states.2",
        "intermediates:encoder.block.0", "intermediates:encoder.block.0.position_bias",
        "intermediates:encoder.final_layer_norm"}},
      {"transformer",
       {"inputs:hidden_states", "inputs:encoder_hidden_states", "inputs:pooled_projections",
        "inputs:timestep", "inputs:img_ids", "inputs:txt_ids", "outputs:sample",
        "intermediates:x_embedder", "intermediates:time_text_embed", "intermediates:pos_embed.cos",
        "intermediates:norm_out", "intermediates:proj_out"}},
      {"vae.decode",
       {"inputs:z", "outputs:sample", "intermediates:decoder.mid_block",
        "intermediates:decoder.up_blocks.3", "intermediates:decoder.conv_out"}},
      {"vae.encode",
       {"inputs:sample", "outputs:latent_dist.mean", "outputs:latent_dist.logvar",
        "intermediates:encoder.down_blocks.3", "intermediates:encoder.mid_block"}},
  };
  for (int i = 0; i < n; ++i)
    for (const char* block : {"transformer_blocks.", "single_transformer_blocks."})
      for (const char* field : {".encoder_hidden_states", ".hidden_states"})
        required["transformer"].push_back("intermediates:" + std::string(block) +
                                          std::to_string(i) + field);
  if (GetParam().guidance_embeds) required["transformer"].push_back("inputs:guidance");

  std::set<std::string> components;
  for (const auto& c : index["components"]) components.insert(c.get<std::string>());
  EXPECT_EQ(components.size(), required.size());
  for (const auto& [comp, names] : required) {
    ASSERT_TRUE(components.count(comp)) << comp;
    for (const char* dname : {"f32", "bf16"}) {
      const std::string base = dir + "/components/" + comp + "/" + dname;
      const json manifest = read_json(fixture_path(base + "/manifest.json"));
      const DType dt = std::string(dname) == "f32" ? DType::f32 : DType::bf16;
      for (const char* stem : {"inputs", "outputs", "intermediates"})
        expect_matches_manifest(base + "/" + stem + ".safetensors", manifest[stem], dt,
                                {"guidance", "pos_embed.cos", "pos_embed.sin"});
      for (const auto& req : names) {
        const auto colon = req.find(':');
        EXPECT_TRUE(manifest[req.substr(0, colon)].contains(req.substr(colon + 1)))
            << base << ": " << req;
      }
    }
  }
}

TEST_P(FluxFixtures, PipelineGoldensHaveDocumentedTensors) {
  const std::string dir = golden_dir(GetParam());
  const json index = read_json(fixture_path(dir + "/index.json"));
  ASSERT_GE(index["cases"].size(), 2u);
  const PipelineFolder p = open_pipeline_folder(model_path());
  const int64_t joint = p.component("transformer").config().get_int("joint_attention_dim");
  const int64_t pooled = p.component("transformer").config().get_int("pooled_projection_dim");
  bool non_square = false, not_multiple_of_64 = false, default_seq = false;
  for (const auto& case_name : index["cases"]) {
    for (const char* dname : {"f32", "bf16"}) {
      const std::string base = dir + "/pipeline/" + case_name.get<std::string>() + "/" + dname;
      SCOPED_TRACE(base);
      const json m = read_json(fixture_path(base + "/manifest.json"));
      const int64_t h = m["height"], w = m["width"], steps = m["num_inference_steps"];
      const int64_t seq = m["max_sequence_length"];
      non_square |= h != w;
      not_multiple_of_64 |= (h % 64) != 0 || (w % 64) != 0;
      default_seq |= m["max_sequence_length_is_default"].get<bool>();
      EXPECT_EQ(m["guidance_scale"].get<double>(), GetParam().guidance_embeds ? 3.5 : 0.0);
      for (const char* key : {"prompt", "seed"}) EXPECT_TRUE(m.contains(key)) << key;
      const DType dt = std::string(dname) == "f32" ? DType::f32 : DType::bf16;
      expect_matches_manifest(base + "/tensors.safetensors", m["tensors"], dt,
                              {"image", "timesteps", "sigmas"});
      const auto t = test::load_fixture(base + "/tensors.safetensors");
      const int64_t tokens = (h / 16) * (w / 16);
      const std::map<std::string, Shape> shapes = {{"initial_latents", {1, tokens, 64}},
                                                   {"img_ids", {tokens, 3}},
                                                   {"prompt_embeds", {1, seq, joint}},
                                                   {"pooled_prompt_embeds", {1, pooled}},
                                                   {"txt_ids", {seq, 3}},
                                                   {"t5_input_ids", {1, seq}},
                                                   {"clip_input_ids", {1, 77}},
                                                   {"timesteps", {steps}},
                                                   {"sigmas", {steps + 1}},
                                                   {"vae_z", {1, 16, h / 8, w / 8}},
                                                   {"vae_sample", {1, 3, h, w}},
                                                   {"image", {1, h, w, 3}},
                                                   {"image_uint8", {1, h, w, 3}}};
      for (const auto& [name, shape] : shapes) {
        ASSERT_TRUE(t.count(name)) << name;
        EXPECT_EQ(t.at(name).shape(), shape) << name;
      }
      for (int64_t i = 0; i < steps; ++i)
        for (const char* prefix : {"latents.", "noise_pred.", "timestep."})
          EXPECT_TRUE(t.count(prefix + std::to_string(i))) << prefix << i;
      EXPECT_EQ(t.at("sigmas").to_floats().back(), 0.0f);
      // The uint8 pixels are PIL's: round-half-even of image * 255 in float32.
      const auto img = t.at("image").to_floats();
      const auto px = t.at("image_uint8").to_ints();
      ASSERT_EQ(img.size(), px.size());
      size_t mismatches = 0;
      for (size_t i = 0; i < img.size(); ++i)
        mismatches += int64_t(std::nearbyint(img[i] * 255.0f)) != px[i];
      EXPECT_EQ(mismatches, 0u);
    }
  }
  EXPECT_TRUE(non_square);
  EXPECT_TRUE(not_multiple_of_64);
  EXPECT_TRUE(default_seq);
}

INSTANTIATE_TEST_SUITE_P(Flux1, FluxFixtures, ::testing::ValuesIn(kVariants), [](const auto& info) {
  std::string s = info.param.name;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

}  // namespace
}  // namespace tessera
