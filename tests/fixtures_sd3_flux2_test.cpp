// The committed SD3.5-medium and FLUX.2-dev tiny pipelines and their goldens
// (reference/goldens/pipeline_sd3.py, pipeline_flux2.py) are readable through io/ and hold the
// published layout, the documented tensor names, dtypes and shapes, so the SD3/FLUX.2 model and
// pipeline parity tests can rely on them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
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

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

bool has_file(const ComponentInfo& c, const std::string& file) {
  return std::find(c.files.begin(), c.files.end(), file) != c.files.end();
}

bool generated(const std::string& name) {
  return has_fixture(name) && has_fixture("goldens/" + name + "/index.json");
}

const char* const kNotGenerated = " not generated (reference/make_fixtures.py)";

// Every tensor of a component is bf16 (FLUX.2's VAE also has BatchNorm's int64 step counter),
// sharded components' shards hold exactly the indexed names, and each listed tensor has the
// shape its config implies.
void expect_weights(const PipelineFolder& p, const std::string& comp, bool sharded,
                    const std::map<std::string, Shape>& shapes) {
  SCOPED_TRACE(comp);
  const CheckpointReader ck = CheckpointReader::open(p.component(comp).path);
  EXPECT_EQ(ck.sharded(), sharded);
  if (ck.sharded()) {
    EXPECT_GT(ck.shard_paths().size(), 1u);
    std::set<std::string> from_shards;
    for (const auto& shard : ck.shard_paths())
      for (const auto& [k, v] : load_safetensors(shard)) from_shards.insert(k);
    EXPECT_EQ(from_shards, std::set<std::string>(ck.names().begin(), ck.names().end()));
  }
  for (const auto& n : ck.names()) {
    const Tensor t = ck.get(n);
    if (n.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(t.dtype(), DType::i64) << n;
      continue;
    }
    EXPECT_EQ(t.dtype(), DType::bf16) << n;
    for (float v : t.to_floats()) ASSERT_TRUE(std::isfinite(v)) << n;
  }
  for (const auto& [name, shape] : shapes) {
    ASSERT_TRUE(ck.contains(name)) << name;
    EXPECT_EQ(ck.get(name).shape(), shape) << name;
  }
}

// Names, dtypes and shapes of a golden file agree with its manifest.json entry; floating tensors
// are in the run's dtype except those listed in f32_always.
void expect_matches_manifest(const std::string& file, const json& listed, DType float_dtype,
                             const std::set<std::string>& f32_always = {}) {
  SCOPED_TRACE(file);
  const auto tensors = test::load_fixture(file);
  std::set<std::string> names, listed_names;
  for (const auto& [k, v] : tensors) names.insert(k);
  for (const auto& [k, v] : listed.items()) listed_names.insert(k);
  EXPECT_EQ(names, listed_names);
  for (const auto& [k, t] : tensors) {
    if (!listed.contains(k)) continue;
    EXPECT_EQ(t.shape(), listed[k]["shape"].get<Shape>()) << k;
    if (is_floating(t.dtype()))
      EXPECT_EQ(t.dtype(), f32_always.count(k) ? DType::f32 : float_dtype) << k;
  }
}

// Each component golden (f32 and bf16) matches its manifest and has the required names
// ("inputs:x", "outputs:y", "intermediates:z").
void expect_component_goldens(const std::string& model,
                              const std::map<std::string, std::vector<std::string>>& required,
                              const std::set<std::string>& f32_always) {
  const std::string dir = "goldens/" + model;
  const json index = read_json(fixture_path(dir + "/index.json"));
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
        expect_matches_manifest(base + "/" + stem + ".safetensors", manifest[stem], dt, f32_always);
      for (const auto& req : names) {
        const auto colon = req.find(':');
        EXPECT_TRUE(manifest[req.substr(0, colon)].contains(req.substr(colon + 1)))
            << base << ": " << req;
      }
    }
  }
}

// What every pipeline case shares: manifest/tensor agreement, per-step tensors, sigmas ending in
// 0, PIL's uint8 pixels; returns the cases' (height, width, default-length) coverage.
struct Coverage {
  bool non_square = false, not_multiple_of_64 = false, default_seq = false;
};

void expect_common_case(const std::map<std::string, Tensor>& t, const json& m, Coverage& cov) {
  const int64_t h = m["height"], w = m["width"], steps = m["num_inference_steps"];
  cov.non_square |= h != w;
  cov.not_multiple_of_64 |= (h % 64) != 0 || (w % 64) != 0;
  cov.default_seq |= m["max_sequence_length_is_default"].get<bool>();
  for (const char* key : {"prompt", "seed", "guidance_scale"}) EXPECT_TRUE(m.contains(key)) << key;
  for (int64_t i = 0; i < steps; ++i)
    for (const char* prefix : {"latents.", "noise_pred.", "timestep."})
      EXPECT_TRUE(t.count(prefix + std::to_string(i))) << prefix << i;
  EXPECT_EQ(t.at("timesteps").shape(), Shape({steps}));
  EXPECT_EQ(t.at("sigmas").shape(), Shape({steps + 1}));
  EXPECT_EQ(t.at("sigmas").to_floats().back(), 0.0f);
  EXPECT_EQ(t.at("vae_sample").shape(), Shape({1, 3, h, w}));
  EXPECT_EQ(t.at("image").shape(), Shape({1, h, w, 3}));
  const auto img = t.at("image").to_floats();
  const auto px = t.at("image_uint8").to_ints();
  ASSERT_EQ(img.size(), px.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < img.size(); ++i)
    mismatches += int64_t(std::nearbyint(img[i] * 255.0f)) != px[i];
  EXPECT_EQ(mismatches, 0u);
}

// ---- SD3.5-medium -------------------------------------------------------------------------------

constexpr const char* kSd3 = "sd35-medium-tiny";

TEST(Sd35Fixtures, PipelineFolderHasPublishedLayout) {
  if (!generated(kSd3)) GTEST_SKIP() << kSd3 << kNotGenerated;
  const PipelineFolder p = open_pipeline_folder(fixture_path(kSd3));
  EXPECT_EQ(p.class_name, "StableDiffusion3Pipeline");
  const std::map<std::string, std::string> classes = {
      {"scheduler", "FlowMatchEulerDiscreteScheduler"},
      {"text_encoder", "CLIPTextModelWithProjection"},
      {"text_encoder_2", "CLIPTextModelWithProjection"},
      {"text_encoder_3", "T5EncoderModel"},
      {"tokenizer", "CLIPTokenizer"},
      {"tokenizer_2", "CLIPTokenizer"},
      {"tokenizer_3", "T5TokenizerFast"},
      {"transformer", "SD3Transformer2DModel"},
      {"vae", "AutoencoderKL"}};
  for (const auto& [name, cls] : classes) {
    ASSERT_TRUE(p.has_component(name)) << name;
    EXPECT_TRUE(p.component(name).present) << name;
    EXPECT_EQ(p.component(name).class_name, cls) << name;
  }
  for (const char* tok : {"tokenizer", "tokenizer_2"})
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
      EXPECT_TRUE(has_file(p.component(tok), f)) << tok << "/" << f;
  for (const char* f : {"spiece.model", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(has_file(p.component("tokenizer_3"), f)) << "tokenizer_3/" << f;
  // The published CLIP-G tokenizer pads with "!" (id 0); CLIP-L with <|endoftext|>.
  EXPECT_EQ(p.component("tokenizer").config().get_string("pad_token"), "<|endoftext|>");
  EXPECT_EQ(p.component("tokenizer_2").config().get_string("pad_token"), "!");
}

TEST(Sd35Fixtures, ConfigsKeepTheRealStructure) {
  if (!generated(kSd3)) GTEST_SKIP() << kSd3 << kNotGenerated;
  const PipelineFolder p = open_pipeline_folder(fixture_path(kSd3));
  const JsonConfig s = p.component("scheduler").config();
  EXPECT_EQ(s.get_float("shift"), 3.0);
  EXPECT_FALSE(s.get_bool("use_dynamic_shifting"));
  EXPECT_EQ(s.get_int("num_train_timesteps"), 1000);

  const JsonConfig vae = p.component("vae").config();
  EXPECT_EQ(vae.get_int("latent_channels"), 16);
  EXPECT_EQ(vae.get_float("scaling_factor"), 1.5305);
  EXPECT_EQ(vae.get_float("shift_factor"), 0.0609);
  EXPECT_FALSE(vae.get_bool("use_quant_conv"));
  EXPECT_FALSE(vae.get_bool("use_post_quant_conv"));
  EXPECT_EQ(vae.get_int_list("block_out_channels").size(), 4u);  // vae_scale_factor 8

  const JsonConfig l = p.component("text_encoder").config();
  const JsonConfig g = p.component("text_encoder_2").config();
  const JsonConfig t5 = p.component("text_encoder_3").config();
  const JsonConfig tr = p.component("transformer").config();
  EXPECT_EQ(l.get_string("hidden_act"), "quick_gelu");
  EXPECT_EQ(g.get_string("hidden_act"), "gelu");
  EXPECT_EQ(l.get_int("eos_token_id"), 2);  // pooled output at argmax(input_ids)
  EXPECT_EQ(tr.get_string("qk_norm"), "rms_norm");
  EXPECT_FALSE(tr.get_int_list("dual_attention_layers").empty());
  EXPECT_GT(tr.get_int("num_attention_heads"), 1);
  // CLIP-L + CLIP-G states are zero-padded to the T5 width, which the transformer takes.
  EXPECT_EQ(tr.get_int("joint_attention_dim"), t5.get_int("d_model"));
  EXPECT_LT(l.get_int("hidden_size") + g.get_int("hidden_size"), t5.get_int("d_model"));
  EXPECT_EQ(tr.get_int("pooled_projection_dim"),
            l.get_int("projection_dim") + g.get_int("projection_dim"));
  EXPECT_EQ(tr.get_int("caption_projection_dim"),
            tr.get_int("num_attention_heads") * tr.get_int("attention_head_dim"));
}

TEST(Sd35Fixtures, ComponentWeightsLoad) {
  if (!generated(kSd3)) GTEST_SKIP() << kSd3 << kNotGenerated;
  const PipelineFolder p = open_pipeline_folder(fixture_path(kSd3));
  const JsonConfig l = p.component("text_encoder").config();
  const JsonConfig t5 = p.component("text_encoder_3").config();
  const JsonConfig tr = p.component("transformer").config();
  const int64_t hd = tr.get_int("attention_head_dim");
  const int64_t inner = tr.get_int("num_attention_heads") * hd;
  const int64_t last = tr.get_int("num_layers") - 1;
  const std::string lb = "transformer_blocks." + std::to_string(last) + ".";
  expect_weights(
      p, "text_encoder", false,
      {{"text_model.embeddings.token_embedding.weight", {49408, l.get_int("hidden_size")}},
       {"text_projection.weight", {l.get_int("projection_dim"), l.get_int("hidden_size")}}});
  expect_weights(p, "text_encoder_2", false, {});
  expect_weights(p, "text_encoder_3", true,
                 {{"shared.weight", {t5.get_int("vocab_size"), t5.get_int("d_model")}}});
  expect_weights(p, "transformer", true,
                 {{"pos_embed.proj.weight", {inner, 16, 2, 2}},
                  {"context_embedder.weight", {inner, tr.get_int("joint_attention_dim")}},
                  {"transformer_blocks.0.attn.norm_q.weight", {hd}},
                  {"transformer_blocks.0.attn2.to_q.weight", {inner, inner}},
                  {"transformer_blocks.0.norm1.linear.weight", {9 * inner, inner}},
                  {lb + "norm1_context.linear.weight", {2 * inner, inner}},
                  {"proj_out.weight", {2 * 2 * 16, inner}}});
  expect_weights(p, "vae", false, {{"decoder.conv_in.weight", {16, 16, 3, 3}}});
  // The context_pre_only last block has no context feed-forward nor context output projection.
  const CheckpointReader ck = CheckpointReader::open(p.component("transformer").path);
  EXPECT_FALSE(ck.contains(lb + "ff_context.net.0.proj.weight"));
  EXPECT_FALSE(ck.contains(lb + "attn.to_add_out.weight"));
  EXPECT_TRUE(ck.contains("transformer_blocks.0.ff_context.net.0.proj.weight"));
}

TEST(Sd35Fixtures, ComponentGoldensHaveDocumentedNames) {
  if (!generated(kSd3)) GTEST_SKIP() << kSd3 << kNotGenerated;
  std::map<std::string, std::vector<std::string>> required = {
      {"text_encoder",
       {"inputs:input_ids", "outputs:text_embeds", "outputs:last_hidden_state",
        "outputs:hidden_states.1", "intermediates:text_model.encoder.layers.0"}},
      {"text_encoder_2",
       {"inputs:input_ids", "outputs:text_embeds", "outputs:hidden_states.2",
        "intermediates:text_model.final_layer_norm"}},
      {"text_encoder_3",
       {"inputs:input_ids", "outputs:last_hidden_state", "intermediates:encoder.block.0",
        "intermediates:encoder.block.0.position_bias", "intermediates:encoder.final_layer_norm"}},
      {"transformer",
       {"inputs:hidden_states", "inputs:timestep", "inputs:encoder_hidden_states",
        "inputs:pooled_projections", "outputs:sample", "intermediates:pos_embed",
        "intermediates:time_text_embed", "intermediates:context_embedder",
        "intermediates:transformer_blocks.0.encoder_hidden_states",
        "intermediates:transformer_blocks.0.hidden_states",
        "intermediates:transformer_blocks.0.attn2",
        "intermediates:transformer_blocks.0.norm1.norm_hidden_states2",
        "intermediates:transformer_blocks.3.hidden_states", "intermediates:norm_out"}},
      {"vae.decode", {"inputs:z", "outputs:sample", "intermediates:decoder.up_blocks.3"}},
      {"vae.encode",
       {"inputs:sample", "outputs:latent_dist.mean", "outputs:latent_dist.logvar",
        "intermediates:encoder.down_blocks.3"}},
  };
  expect_component_goldens(kSd3, required, {});
}

TEST(Sd35Fixtures, PipelineGoldensHaveDocumentedTensors) {
  if (!generated(kSd3)) GTEST_SKIP() << kSd3 << kNotGenerated;
  const std::string dir = std::string("goldens/") + kSd3;
  const json index = read_json(fixture_path(dir + "/index.json"));
  ASSERT_GE(index["cases"].size(), 2u);
  Coverage cov;
  bool cfg = false, no_cfg = false;
  for (const auto& case_name : index["cases"]) {
    for (const char* dname : {"f32", "bf16"}) {
      const std::string base = dir + "/pipeline/" + case_name.get<std::string>() + "/" + dname;
      SCOPED_TRACE(base);
      const json m = read_json(fixture_path(base + "/manifest.json"));
      const DType dt = std::string(dname) == "f32" ? DType::f32 : DType::bf16;
      // SD3 hands the transformer the scheduler's float32 timestep even in a bf16 run.
      expect_matches_manifest(
          base + "/tensors.safetensors", m["tensors"], dt,
          {"image", "timesteps", "sigmas", "timestep.0", "timestep.1", "timestep.2", "timestep.3"});
      const auto t = test::load_fixture(base + "/tensors.safetensors");
      expect_common_case(t, m, cov);
      const int64_t h = m["height"], w = m["width"], seq = m["max_sequence_length"];
      const bool guided = m["guidance_scale"].get<double>() > 1.0;
      cfg |= guided;
      no_cfg |= !guided;
      const std::map<std::string, Shape> shapes = {
          {"initial_latents", {1, 16, h / 8, w / 8}},
          {"prompt_embeds", {1, 77 + seq, 32}},
          {"pooled_prompt_embeds", {1, 20}},
          {"clip_l_input_ids", {1, 77}},
          {"clip_g_input_ids", {1, 77}},
          {"t5_input_ids", {1, seq}},
          {"vae_z", {1, 16, h / 8, w / 8}},
          {"noise_pred.0", {guided ? 2 : 1, 16, h / 8, w / 8}}};
      for (const auto& [name, shape] : shapes) {
        ASSERT_TRUE(t.count(name)) << name;
        EXPECT_EQ(t.at(name).shape(), shape) << name;
      }
      EXPECT_EQ(t.count("negative_prompt_embeds"), guided ? 1u : 0u);
      // SD3's CLIP-G tokenizer pads with "!" (id 0), CLIP-L with <|endoftext|> (49407).
      EXPECT_EQ(t.at("clip_g_input_ids").to_ints().back(), 0);
      EXPECT_EQ(t.at("clip_l_input_ids").to_ints().back(), 49407);
    }
  }
  EXPECT_TRUE(cov.non_square);
  EXPECT_TRUE(cov.not_multiple_of_64);
  EXPECT_TRUE(cov.default_seq);
  EXPECT_TRUE(cfg);
  EXPECT_TRUE(no_cfg);
}

// ---- FLUX.2-dev ---------------------------------------------------------------------------------

constexpr const char* kFlux2 = "flux2-dev-tiny";

TEST(Flux2Fixtures, PipelineFolderHasPublishedLayout) {
  if (!generated(kFlux2)) GTEST_SKIP() << kFlux2 << kNotGenerated;
  const PipelineFolder p = open_pipeline_folder(fixture_path(kFlux2));
  EXPECT_EQ(p.class_name, "Flux2Pipeline");
  const std::map<std::string, std::string> classes = {
      {"scheduler", "FlowMatchEulerDiscreteScheduler"},
      {"text_encoder", "Mistral3ForConditionalGeneration"},
      {"tokenizer", "PixtralProcessor"},
      {"transformer", "Flux2Transformer2DModel"},
      {"vae", "AutoencoderKLFlux2"}};
  for (const auto& [name, cls] : classes) {
    ASSERT_TRUE(p.has_component(name)) << name;
    EXPECT_TRUE(p.component(name).present) << name;
    EXPECT_EQ(p.component(name).class_name, cls) << name;
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                        "processor_config.json", "preprocessor_config.json"})
    EXPECT_TRUE(has_file(p.component("tokenizer"), f)) << "tokenizer/" << f;
}

TEST(Flux2Fixtures, ConfigsKeepTheRealStructure) {
  if (!generated(kFlux2)) GTEST_SKIP() << kFlux2 << kNotGenerated;
  const PipelineFolder p = open_pipeline_folder(fixture_path(kFlux2));
  const JsonConfig s = p.component("scheduler").config();
  EXPECT_TRUE(s.get_bool("use_dynamic_shifting"));
  EXPECT_EQ(s.get_string("time_shift_type"), "exponential");

  const JsonConfig tr = p.component("transformer").config();
  int64_t axes = 0;
  for (int64_t a : tr.get_int_list("axes_dims_rope")) axes += a;
  EXPECT_EQ(tr.get_int_list("axes_dims_rope").size(), 4u);
  EXPECT_EQ(axes, tr.get_int("attention_head_dim"));
  EXPECT_GT(tr.get_int("num_attention_heads"), 1);
  EXPECT_EQ(tr.get_int("rope_theta"), 2000);
  EXPECT_TRUE(tr.get_bool("guidance_embeds"));

  // The pipeline stacks hidden_states[10], [20], [30]: the text model is deeper than 30 layers.
  const JsonConfig te = p.component("text_encoder").config().get_object("text_config");
  EXPECT_GT(te.get_int("num_hidden_layers"), 30);
  EXPECT_EQ(tr.get_int("joint_attention_dim"), 3 * te.get_int("hidden_size"));
  EXPECT_NE(te.get_int("num_attention_heads") * te.get_int("head_dim"), te.get_int("hidden_size"));
  EXPECT_LT(te.get_int("num_key_value_heads"), te.get_int("num_attention_heads"));

  const JsonConfig vae = p.component("vae").config();
  EXPECT_EQ(vae.get_int("latent_channels") * 4, tr.get_int("in_channels"));
  EXPECT_EQ(vae.get_float("batch_norm_eps"), 1e-4);
}

TEST(Flux2Fixtures, ComponentWeightsLoad) {
  if (!generated(kFlux2)) GTEST_SKIP() << kFlux2 << kNotGenerated;
  const PipelineFolder p = open_pipeline_folder(fixture_path(kFlux2));
  const JsonConfig te = p.component("text_encoder").config().get_object("text_config");
  const JsonConfig tr = p.component("transformer").config();
  const int64_t inner = tr.get_int("num_attention_heads") * tr.get_int("attention_head_dim");
  const int64_t hidden = te.get_int("hidden_size");
  const int64_t q = te.get_int("num_attention_heads") * te.get_int("head_dim");
  expect_weights(p, "text_encoder", true,
                 {{"language_model.model.embed_tokens.weight", {te.get_int("vocab_size"), hidden}},
                  {"language_model.model.layers.29.self_attn.q_proj.weight", {q, hidden}},
                  {"language_model.model.layers.29.self_attn.k_proj.weight",
                   {te.get_int("num_key_value_heads") * te.get_int("head_dim"), hidden}},
                  {"language_model.lm_head.weight", {te.get_int("vocab_size"), hidden}}});
  expect_weights(p, "transformer", true,
                 {{"x_embedder.weight", {inner, tr.get_int("in_channels")}},
                  {"context_embedder.weight", {inner, tr.get_int("joint_attention_dim")}},
                  {"double_stream_modulation_img.linear.weight", {6 * inner, inner}},
                  {"single_stream_modulation.linear.weight", {3 * inner, inner}},
                  {"proj_out.weight", {tr.get_int("in_channels"), inner}}});
  expect_weights(p, "vae", false, {{"bn.running_mean", {128}}, {"bn.running_var", {128}}});
  // De-normalisation must be exercised: the statistics are not the identity.
  const CheckpointReader vae = CheckpointReader::open(p.component("vae").path);
  const auto mean = vae.get("bn.running_mean").to_floats();
  const auto var = vae.get("bn.running_var").to_floats();
  EXPECT_GT(*std::max_element(mean.begin(), mean.end()), 0.1f);
  EXPECT_GT(*std::max_element(var.begin(), var.end()), 1.5f);
  EXPECT_LT(*std::min_element(var.begin(), var.end()), 0.7f);
}

TEST(Flux2Fixtures, ComponentGoldensHaveDocumentedNames) {
  if (!generated(kFlux2)) GTEST_SKIP() << kFlux2 << kNotGenerated;
  const std::string lm = "intermediates:model.language_model.";
  std::map<std::string, std::vector<std::string>> required = {
      {"text_encoder",
       {"inputs:input_ids", "inputs:attention_mask", "outputs:hidden_states.10",
        "outputs:hidden_states.20", "outputs:hidden_states.30", "outputs:prompt_embeds",
        lm + "embed_tokens", lm + "layers.0.self_attn", lm + "layers.29"}},
      {"transformer",
       {"inputs:hidden_states", "inputs:encoder_hidden_states", "inputs:timestep", "inputs:img_ids",
        "inputs:txt_ids", "inputs:guidance", "outputs:sample", "intermediates:time_guidance_embed",
        "intermediates:double_stream_modulation_img", "intermediates:pos_embed.img.cos",
        "intermediates:pos_embed.txt.sin",
        "intermediates:transformer_blocks.0.encoder_hidden_states",
        "intermediates:transformer_blocks.1.hidden_states",
        "intermediates:single_transformer_blocks.1", "intermediates:norm_out"}},
      {"vae.decode", {"inputs:z", "outputs:sample", "intermediates:post_quant_conv"}},
      {"vae.encode",
       {"inputs:sample", "outputs:latent_dist.mean", "outputs:bn.running_var",
        "intermediates:quant_conv"}},
  };
  expect_component_goldens(kFlux2, required,
                           {"guidance", "pos_embed.img.cos", "pos_embed.img.sin",
                            "pos_embed.txt.cos", "pos_embed.txt.sin"});
}

TEST(Flux2Fixtures, PipelineGoldensHaveDocumentedTensors) {
  if (!generated(kFlux2)) GTEST_SKIP() << kFlux2 << kNotGenerated;
  const std::string dir = std::string("goldens/") + kFlux2;
  const json index = read_json(fixture_path(dir + "/index.json"));
  ASSERT_GE(index["cases"].size(), 2u);
  Coverage cov;
  for (const auto& case_name : index["cases"]) {
    for (const char* dname : {"f32", "bf16"}) {
      const std::string base = dir + "/pipeline/" + case_name.get<std::string>() + "/" + dname;
      SCOPED_TRACE(base);
      const json m = read_json(fixture_path(base + "/manifest.json"));
      const DType dt = std::string(dname) == "f32" ? DType::f32 : DType::bf16;
      // FLUX.2 casts the timestep to the latents' dtype (bf16 in a bf16 run); guidance is f32.
      expect_matches_manifest(base + "/tensors.safetensors", m["tensors"], dt,
                              {"image", "timesteps", "sigmas", "guidance"});
      const auto t = test::load_fixture(base + "/tensors.safetensors");
      expect_common_case(t, m, cov);
      const int64_t h = m["height"], w = m["width"], seq = m["max_sequence_length"];
      const int64_t tokens = (h / 16) * (w / 16);
      EXPECT_EQ(m["guidance_scale"].get<double>(), 4.0);
      const std::map<std::string, Shape> shapes = {{"initial_latents", {1, tokens, 128}},
                                                   {"latent_ids", {1, tokens, 4}},
                                                   {"prompt_embeds", {1, seq, 96}},
                                                   {"text_ids", {1, seq, 4}},
                                                   {"input_ids", {1, seq}},
                                                   {"attention_mask", {1, seq}},
                                                   {"noise_pred.0", {1, tokens, 128}},
                                                   {"vae_z", {1, 32, h / 8, w / 8}},
                                                   {"guidance", {1}}};
      for (const auto& [name, shape] : shapes) {
        ASSERT_TRUE(t.count(name)) << name;
        EXPECT_EQ(t.at(name).shape(), shape) << name;
      }
      // Image ids are (0, row, col, 0) over the 2x2-patchified grid, row-major.
      const auto ids = t.at("latent_ids").to_ints();
      EXPECT_EQ(ids[4 * (tokens - 1) + 1], h / 16 - 1);
      EXPECT_EQ(ids[4 * (tokens - 1) + 2], w / 16 - 1);
    }
  }
  EXPECT_TRUE(cov.non_square);
  EXPECT_TRUE(cov.not_multiple_of_64);
  EXPECT_TRUE(cov.default_seq);
}

}  // namespace
}  // namespace tessera
