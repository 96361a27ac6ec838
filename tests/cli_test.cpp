// The tessera CLI as a user runs it (TESSERA_CLI_PATH): exit codes and what it prints.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/png.h"
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


// `generate` on the tiny schnell-style test pipeline, small and one step unless `extra` says
// otherwise; `out` is the PNG.
Result generate_tiny(const std::string& extra, const std::string& out,
                     const std::string& model = "flux1-schnell-tiny") {
  return run_cli("generate --model " + quote(test::fixture_path(model)) +
                 " --height 32 --width 32 --steps 1 " + extra + " -o " + quote(out));
}

bool has_keyword(const PngImage& img, const std::string& keyword) {
  for (const auto& [k, v] : img.text)
    if (k == keyword) return true;
  return false;
}

// Issue 19 item 2: an empty prompt makes an image (diffusers does), its PNG text chunk empty.
TEST(CliGenerate, EmptyPromptMakesAnImage) {
  TempDir dir;
  const std::string out = dir / "empty.png";
  Result r = generate_tiny("--prompt '' --seed 5", out);
  ASSERT_EQ(r.code, 0) << r.err;
  PngImage img = read_png(out);
  EXPECT_EQ(img.width, 32);
  EXPECT_TRUE(has_keyword(img, "prompt"));
  EXPECT_EQ(img.text_value("prompt"), "");
  EXPECT_FALSE(has_keyword(img, "prompt_2"));
  EXPECT_EQ(img.text_value("seed"), "5");
  // An empty tEXt chunk: keyword, NUL, no text (length 7).
  EXPECT_NE(test::read_text(out).find(std::string("\0\0\0\x07tEXtprompt\0", 15)),
            std::string::npos);

  r = generate_tiny("--prompt '' --prompt-2 'a red cube' --seed 5", out);
  ASSERT_EQ(r.code, 0) << r.err;
  img = read_png(out);
  EXPECT_TRUE(has_keyword(img, "prompt"));
  EXPECT_EQ(img.text_value("prompt"), "");
  EXPECT_EQ(img.text_value("prompt_2"), "a red cube");
}

// Any UTF-8 prompt is stored whole; one that is not UTF-8 fails before the model loads.
TEST(CliGenerate, NonAsciiAndLongPromptsAreStoredWhole) {
  TempDir dir;
  const std::string out = dir / "u.png";
  std::string prompt = "caf\xc3\xa9\tna\xc3\xafve \xf0\x9f\x90\x88 \xe6\x9d\xb1\xe4\xba\xac, \"quoted\"\n";
  while (prompt.size() < 20000) prompt += prompt;
  Result r = generate_tiny("--prompt " + quote(prompt) + " --seed 1", out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_png(out).text_value("prompt"), prompt);

  r = generate_tiny("--prompt " + quote("bad \xff byte") + " --seed 1", dir / "bad.png");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("'prompt' is not valid UTF-8"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("step"), std::string::npos) << r.err;  // no denoising ran
  EXPECT_FALSE(fs::exists(dir / "bad.png"));
}

// Issue 19 item 3: exactly torch.Generator.manual_seed's range, negatives mapped as torch maps
// them (seed + 2^64); the PNG and report record the seed as given.
TEST(CliGenerate, SeedRangeIsTorchs) {
  TempDir dir;
  const std::string range = "expected an integer in [-9223372036854775808, 18446744073709551615]";
  for (const std::string bad : {"18446744073709551616", "-9223372036854775809",
                                "99999999999999999999999", "1.5", "abc", "0x10", "''"}) {
    SCOPED_TRACE(bad);
    const Result r = generate_tiny("--prompt cat --seed " + bad, dir / "x.png");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--seed " + (bad == "''" ? std::string() : bad) + ": " + range),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("step"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "x.png"));
  }
  // -1 seeds as 2^64 - 1, -2^63 as 2^63: the same noise, so the same pixels.
  const std::vector<std::pair<std::string, std::string>> same = {
      {"-1", "18446744073709551615"}, {"-9223372036854775808", "9223372036854775808"}};
  for (const auto& [negative, positive] : same) {
    SCOPED_TRACE(negative);
    const std::string a = dir / "a.png", b = dir / "b.png", report = dir / "r.json";
    Result r = generate_tiny("--prompt cat --seed " + negative + " --report " + quote(report), a);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("seed " + negative + ")"), std::string::npos) << r.err;
    r = generate_tiny("--prompt cat --seed " + positive, b);
    ASSERT_EQ(r.code, 0) << r.err;
    const PngImage pa = read_png(a), pb = read_png(b);
    EXPECT_EQ(pa.rgb, pb.rgb);
    EXPECT_EQ(pa.text_value("seed"), negative);
    EXPECT_EQ(pb.text_value("seed"), positive);
    EXPECT_EQ(nlohmann::json::parse(test::read_text(report))["seed"].dump(), negative);
  }
  const Result r = run_cli("generate --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("-9223372036854775808, 18446744073709551615"), std::string::npos) << r.out;
}

// Issue 19 item 4: every default is FluxPipeline.__call__'s, schnell-style folders included:
// 28 steps, guidance 3.5, 512 T5 tokens; more than 512 tokens is an error, as in diffusers.
TEST(CliGenerate, DefaultsAreFluxPipelineCallDefaults) {
  TempDir dir;
  for (const std::string model : {"flux1-schnell-tiny", "flux1-dev-tiny"}) {
    SCOPED_TRACE(model);
    const std::string report = dir / "r.json";
    const Result r = run_cli("generate --model " + quote(test::fixture_path(model)) +
                             " --height 32 --width 32 --prompt cat --seed 0 --report " +
                             quote(report) + " -o " + quote(dir / "d.png"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(test::read_text(report));
    EXPECT_EQ(j["steps"], 28);
    EXPECT_EQ(j["times"]["steps"].size(), 28u);
    EXPECT_EQ(j["guidance"], 3.5);
    EXPECT_EQ(j["max_sequence_length"], 512);
    const PngImage img = read_png(dir / "d.png");
    EXPECT_EQ(img.text_value("steps"), "28");
    EXPECT_EQ(img.text_value("guidance"), "3.5");
  }
  const Result r = generate_tiny("--prompt cat --max-sequence-length 513", dir / "x.png");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--max-sequence-length: cannot be greater than 512, got 513"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "x.png"));
  const Result h = run_cli("generate --help");
  EXPECT_NE(h.out.find("default 512"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("default 28"), std::string::npos) << h.out;
}

}  // namespace
}  // namespace tessera
