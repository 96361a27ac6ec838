// Sharded checkpoints, model folders and config access, on folders built in a temp dir.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "io_test_folder.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// Runs `fn`, expecting a tessera::Error whose one-line message contains every `parts`.
template <typename F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(Checkpoint, ShardedIndexLoadsEveryTensorZeroCopy) {
  TempDir dir;
  test::make_pipeline_folder(dir.path());
  const std::string folder = dir / "transformer";
  for (const std::string& path :
       {folder, folder + "/diffusion_pytorch_model.safetensors.index.json"}) {
    SCOPED_TRACE(path);
    const CheckpointReader ckpt = CheckpointReader::open(path);
    EXPECT_TRUE(ckpt.sharded());
    EXPECT_EQ(ckpt.path(), folder + "/diffusion_pytorch_model.safetensors.index.json");
    EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"proj_out.weight", "x_embedder.bias",
                                                      "x_embedder.weight"}));
    EXPECT_EQ(ckpt.shard_paths().size(), 2u);
    EXPECT_EQ(fs::path(ckpt.shard_path("proj_out.weight")).filename(),
              "diffusion_pytorch_model-00002-of-00002.safetensors");
    EXPECT_EQ(ckpt.metadata().at("total_size"), "20");
    EXPECT_TRUE(ckpt.contains("x_embedder.bias"));
    EXPECT_FALSE(ckpt.contains("nope"));
    const Tensor w = ckpt.get("proj_out.weight");
    EXPECT_EQ(w.dtype(), DType::bf16);
    EXPECT_EQ(w.shape(), (Shape{2, 2}));
    EXPECT_EQ(w.to_floats(), (std::vector<float>{7, 8, 9, 10}));
    EXPECT_FALSE(w.storage()->owned());
    EXPECT_EQ(ckpt.get("x_embedder.bias").to_floats(), (std::vector<float>{5, 6}));
    const CheckpointSummary s = ckpt.summary();
    EXPECT_EQ(s.tensors, 3u);
    EXPECT_EQ(s.bytes, 20u);
    EXPECT_EQ(s.dtypes_str(), "bf16:3");
    expect_error([&] { ckpt.get("nope"); }, {"no tensor named 'nope'"});
  }
}

TEST(Checkpoint, SingleFileFoldersAndVariants) {
  TempDir dir;
  const Tensor a = Tensor::from_floats({1, 2, 3}, {3});
  for (const char* d : {"d", "m", "two"}) fs::create_directories(dir / d);
  save_safetensors(dir / "d/diffusion_pytorch_model.safetensors", {{"a", a}});
  save_safetensors(dir / "d/diffusion_pytorch_model.fp16.safetensors",
                   {{"a", Tensor::from_floats({1, 2, 3}, {3}, DType::f16)}});
  save_safetensors(dir / "m/model.safetensors", {{"b", a}});
  EXPECT_EQ(find_checkpoint(dir / "d"), dir / "d/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(find_checkpoint(dir / "d", "fp16"), dir / "d/diffusion_pytorch_model.fp16.safetensors");
  EXPECT_EQ(CheckpointReader::open(dir / "d", "fp16").get("a").dtype(), DType::f16);
  const CheckpointReader m = CheckpointReader::open(dir / "m");
  EXPECT_FALSE(m.sharded());
  EXPECT_EQ(m.names(), (std::vector<std::string>{"b"}));
  EXPECT_EQ(m.get("b").to_floats(), (std::vector<float>{1, 2, 3}));
  expect_error([&] { CheckpointReader::open(dir / "m", "bf16"); },
               {"no weights for variant 'bf16'"});
  // Folders with no weights, ambiguous weights, or only pickles.
  fs::create_directories(dir / "empty");
  EXPECT_EQ(find_checkpoint(dir / "empty"), "");
  expect_error([&] { CheckpointReader::open(dir / "empty"); }, {dir / "empty", "no weights"});
  save_safetensors(dir / "two/x.safetensors", {{"a", a}});
  save_safetensors(dir / "two/y.safetensors", {{"a", a}});
  expect_error([&] { find_checkpoint(dir / "two"); }, {"2 .safetensors files and no index"});
  test::write_text(dir / "pickle/pytorch_model.bin", "x");
  expect_error([&] { find_checkpoint(dir / "pickle"); },
               {"pytorch_model.bin", "reads .safetensors"});
}

TEST(Checkpoint, MalformedShardedCheckpointsNameIndexAndShard) {
  const std::string m = test::fixture_path("malformed/");
  expect_error([&] { CheckpointReader::open(m + "sharded_missing_shard"); },
               {m + "sharded_missing_shard/model.safetensors.index.json",
                "shard 'model-00002-of-00002.safetensors' (holding 1 tensor) is missing"});
  expect_error([&] { CheckpointReader::open(m + "sharded_invalid_json"); },
               {m + "sharded_invalid_json/model.safetensors.index.json", "invalid JSON"});
  const CheckpointReader absent = CheckpointReader::open(m + "sharded_absent_tensor");
  EXPECT_EQ(absent.get("a").to_floats(), (std::vector<float>{1, 2}));
  expect_error([&] { absent.get("b"); },
               {"model.safetensors.index.json", "weight_map maps 'b'",
                "shard 'model-00001-of-00002.safetensors', which has no tensor of that name"});
  expect_error([&] { absent.validate(); }, {"weight_map maps 'b'"});
  expect_error([&] { CheckpointReader::open(m + "sharded_path_escape"); },
               {"'../outside.safetensors' outside the checkpoint folder"});
}

TEST(Checkpoint, IndexWithoutWeightMapIsAnError) {
  TempDir dir;
  test::write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { CheckpointReader::open(dir.path()); }, {"no \"weight_map\" object"});
  test::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  expect_error([&] { CheckpointReader::open(dir.path()); },
               {"weight_map entry for 'a' is a number, expected a shard file name"});
}

TEST(JsonConfig, TypedAccessWithFileAndKeyInErrors) {
  TempDir dir;
  const std::string path = dir / "config.json";
  test::write_text(path, R"({"num_layers": 19, "scale": 0.5, "whole": 3.0, "name": "flux",
      "flag": true, "dims": [16, 56, 56], "ratios": [1, 2.5], "names": ["a", "b"],
      "nothing": null, "sub": {"hidden_size": 8}})");
  const JsonConfig c = JsonConfig::load(path);
  EXPECT_EQ(c.get_int("num_layers"), 19);
  EXPECT_EQ(c.get_int("whole"), 3);
  EXPECT_DOUBLE_EQ(c.get_float("scale"), 0.5);
  EXPECT_DOUBLE_EQ(c.get_float("num_layers"), 19.0);
  EXPECT_EQ(c.get_string("name"), "flux");
  EXPECT_TRUE(c.get_bool("flag"));
  EXPECT_EQ(c.get_int_list("dims"), (std::vector<int64_t>{16, 56, 56}));
  EXPECT_EQ(c.get_float_list("ratios"), (std::vector<double>{1, 2.5}));
  EXPECT_EQ(c.get_string_list("names"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.get_int("absent", 7), 7);
  EXPECT_EQ(c.get_int("nothing", 7), 7);  // null reads as absent for optional values
  EXPECT_FALSE(c.has("nothing"));
  EXPECT_EQ(c.get_object("sub").get_int("hidden_size"), 8);
  expect_error([&] { c.get_int("absent"); }, {"missing key 'absent' in " + path});
  expect_error([&] { c.get_object("sub").get_int("depth"); },
               {"missing key 'sub.depth' in " + path});
  expect_error([&] { c.get_int("scale"); }, {"key 'scale' in " + path, "expected an integer"});
  expect_error([&] { c.get_string("num_layers"); }, {"expected a string"});
  expect_error([&] { c.get_int("nothing"); }, {"key 'nothing' in " + path + " is null"});
  expect_error([&] { c.get_int_list("names"); }, {"expected a list of integers"});
  expect_error([&] { c.get_bool("name", false); }, {"expected true or false"});
  EXPECT_EQ(JsonConfig::from_json(nlohmann::json{{"_x", 1}, {"a", 2}}, "mem").summary(), "a=2");
}

TEST(JsonConfig, BadFilesAreErrors) {
  TempDir dir;
  expect_error([&] { JsonConfig::load(dir / "absent.json"); }, {"absent.json: cannot open"});
  test::write_text(dir / "bad.json", "{\"a\": ");
  expect_error([&] { JsonConfig::load(dir / "bad.json"); }, {"bad.json: invalid JSON"});
  test::write_text(dir / "list.json", "[1]");
  expect_error([&] { JsonConfig::load(dir / "list.json"); },
               {"list.json: top level is a JSON array, expected an object"});
}

TEST(ModelFolder, DiffusersPipelineComponents) {
  TempDir dir;
  test::make_pipeline_folder(dir.path());
  EXPECT_EQ(detect_folder_kind(dir.path()), FolderKind::pipeline);
  for (const std::string& path : {dir.path(), dir / "model_index.json"}) {
    const PipelineFolder p = open_pipeline_folder(path);
    EXPECT_EQ(p.class_name, "FluxPipeline");
    EXPECT_EQ(p.diffusers_version, "0.32.0");
    std::vector<std::string> names;
    for (const auto& c : p.components) names.push_back(c.name);
    EXPECT_EQ(names, (std::vector<std::string>{"image_encoder", "scheduler", "text_encoder",
                                               "tokenizer", "transformer", "vae"}));
    const ComponentInfo& tr = p.component("transformer");
    EXPECT_EQ(tr.library, "diffusers");
    EXPECT_EQ(tr.class_name, "FluxTransformer2DModel");
    EXPECT_EQ(tr.kind, FolderKind::model);
    EXPECT_EQ(fs::path(tr.weights_path).filename(),
              "diffusion_pytorch_model.safetensors.index.json");
    EXPECT_EQ(tr.config().get_int_list("axes_dims_rope"), (std::vector<int64_t>{2, 2, 0}));
    const ComponentInfo& te = p.component("text_encoder");
    EXPECT_EQ(te.library, "transformers");
    EXPECT_EQ(fs::path(te.weights_path).filename(), "model.safetensors");
    const ComponentInfo& sch = p.component("scheduler");
    EXPECT_EQ(sch.kind, FolderKind::scheduler);
    EXPECT_EQ(fs::path(sch.config_path).filename(), "scheduler_config.json");
    EXPECT_DOUBLE_EQ(sch.config().get_float("shift"), 3.0);
    EXPECT_TRUE(sch.weights_path.empty());
    const ComponentInfo& tok = p.component("tokenizer");
    EXPECT_EQ(tok.kind, FolderKind::tokenizer);
    EXPECT_EQ(tok.files,
              (std::vector<std::string>{"merges.txt", "tokenizer_config.json", "vocab.json"}));
    EXPECT_TRUE(p.has_component("vae"));
    EXPECT_FALSE(p.has_component("image_encoder"));
    expect_error([&] { p.component("vae"); }, {"lists component 'vae' but folder", "is missing"});
    expect_error([&] { p.component("image_encoder"); }, {"[null, null]"});
    expect_error([&] { p.component("controlnet"); }, {"no component 'controlnet'"});
    EXPECT_TRUE(p.index.get_bool("force_zeros_for_empty_prompt"));
  }
}

TEST(ModelFolder, TransformersAndComponentFolders) {
  TempDir dir;
  test::make_pipeline_folder(dir.path());
  const ComponentInfo te = open_component_folder(dir / "text_encoder");
  EXPECT_EQ(te.name, "text_encoder");
  EXPECT_EQ(te.kind, FolderKind::model);
  EXPECT_EQ(fs::path(te.config_path).filename(), "config.json");
  EXPECT_EQ(te.config().get_int("hidden_size"), 8);
  EXPECT_EQ(CheckpointReader::open(te.weights_path).names().size(), 2u);
  EXPECT_EQ(detect_folder_kind(dir / "tokenizer"), FolderKind::tokenizer);
  EXPECT_EQ(detect_folder_kind(dir / "nope"), FolderKind::unknown);
  expect_error([&] { open_pipeline_folder(dir / "text_encoder"); },
               {"no model_index.json (not a diffusers pipeline folder)"});
}

TEST(ModelFolder, BadModelIndexEntries) {
  TempDir dir;
  test::write_text(dir / "model_index.json", R"({"vae": ["diffusers"]})");
  expect_error([&] { open_pipeline_folder(dir.path()); }, {"missing key '_class_name'"});
  test::write_text(dir / "model_index.json", R"({"_class_name": "X", "vae": ["diffusers"]})");
  expect_error([&] { open_pipeline_folder(dir.path()); },
               {"model_index.json: component 'vae' is [\"diffusers\"], expected [library, class]"});
  test::write_text(dir / "model_index.json", R"({"_class_name": "X", "../up": ["a", "B"]})");
  expect_error([&] { open_pipeline_folder(dir.path()); }, {"is not a folder name"});
}

}  // namespace
}  // namespace tessera
