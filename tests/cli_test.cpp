// The tessera CLI as a user runs it (TESSERA_CLI_PATH): exit codes and what it prints.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include "io/safetensors.h"
#include "io_test_folder.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

using Result = test::CliResult;
using test::quote;
using test::run_cli;

TEST(Cli, HelpAndVersion) {
  Result r = run_cli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("inspect"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--version"), std::string::npos);
  r = run_cli("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, std::string("tessera ") + TESSERA_VERSION + "\n");
  r = run_cli("inspect --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("safetensors"), std::string::npos);
  r = run_cli("");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Usage"), std::string::npos);
}

TEST(Cli, BadFlagsFailThroughCli11) {
  Result r = run_cli("--no-such-flag");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  r = run_cli("inspect");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("path is required"), std::string::npos) << r.err;
  r = run_cli("frobnicate");
  EXPECT_NE(r.code, 0);
}

TEST(Cli, InspectSafetensorsFile) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  save_safetensors(path,
                   {{"blocks.0.attn.to_q.weight", Tensor::zeros({3, 4}, DType::bf16)},
                    {"pos", Tensor::from_ints({0, 1, 2}, {3}, DType::i64)}},
                   {{"format", "pt"}, {"modelspec.title", "tiny"}});
  const Result r = run_cli("inspect " + quote(path));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* s : {"2 tensors", "format = pt", "modelspec.title = tiny", "name", "dtype",
                        "shape", "bytes", "blocks.0.attn.to_q.weight  bf16   [3, 4]     24",
                        "pos                        i64    [3]        24"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "'" << s << "' not in:\n" << r.out;
}

TEST(Cli, InspectDiffusersPipelineFolder) {
  TempDir dir;
  test::make_pipeline_folder(dir.path());
  const Result r = run_cli("inspect " + quote(dir.path()));
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s :
       {"pipeline: FluxPipeline (diffusers 0.32.0)", "image_encoder: none",
        "scheduler: diffusers FlowMatchEulerDiscreteScheduler",
        "scheduler_config.json: num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=true",
        "text_encoder: transformers CLIPTextModel", "hidden_size=8",
        "weights: model.safetensors: 2 tensors, 96 B (96 bytes), dtypes f32:1, bf16:1",
        "tokenizer: transformers CLIPTokenizer",
        "files: merges.txt, tokenizer_config.json, vocab.json",
        "transformer: diffusers FluxTransformer2DModel", "axes_dims_rope=[2,2,0]",
        "weights: diffusion_pytorch_model.safetensors.index.json (2 shards): 3 tensors, 20 B",
        "vae: diffusers AutoencoderKL (folder missing)"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "'" << s << "' not in:\n" << r.out;
  // model_index.json itself names the same pipeline.
  EXPECT_EQ(run_cli("inspect " + quote(dir / "model_index.json")).out, r.out);
}

TEST(Cli, InspectComponentFolderAndIndex) {
  TempDir dir;
  test::make_pipeline_folder(dir.path());
  Result r = run_cli("inspect --tensors " + quote(dir / "transformer"));
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s :
       {"model: ", "config.json: attention_head_dim=4", "3 tensors",
        "proj_out.weight    bf16   [2, 2]", "diffusion_pytorch_model-00002-of-00002.safetensors"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "'" << s << "' not in:\n" << r.out;
  r = run_cli("inspect " +
              quote(dir / "transformer/diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s : {"shards: 2", "total_size = 20", "x_embedder.bias", "shard"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "'" << s << "' not in:\n" << r.out;
  r = run_cli("inspect " + quote(dir / "tokenizer"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("files: merges.txt"), std::string::npos) << r.out;
}

TEST(Cli, InspectMalformedFilesExitsNonZeroWithOneLine) {
  const std::string m = test::fixture_path("malformed/");
  std::vector<std::string> paths;
  for (const auto& de : fs::directory_iterator(m)) {
    const std::string n = de.path().filename().string();
    if (n.ends_with(".safetensors") || n.rfind("sharded_", 0) == 0)
      paths.push_back(de.path().string());
  }
  ASSERT_GE(paths.size(), 20u);
  for (const auto& p : paths) {
    SCOPED_TRACE(p);
    const Result r = run_cli("inspect " + quote(p));
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("tessera: error: " + p, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(Cli, InspectMissingPathAndNonModelFolder) {
  TempDir dir;
  Result r = run_cli("inspect " + quote(dir / "absent"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "tessera: error: " + (dir / "absent") + ": no such file or folder\n");
  r = run_cli("inspect " + quote(dir.path()));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not a model folder"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
