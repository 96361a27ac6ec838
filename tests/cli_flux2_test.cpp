// `tessera generate` on the tiny FLUX.2-dev pipeline: --text-encoder-out-layers reaches
// Flux2Pipeline (its default 10 20 30 gives the default's image, other layers another image),
// bad layers fail with one line, and the other pipelines refuse the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "io/png.h"
#include "io_test_folder.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::quote;
using test::run_cli;
using test::TempDir;

TEST(CliFlux2Generate, TextEncoderOutLayers) {
  TempDir tmp;
  const std::string flux2 = quote(test::fixture_path("flux2-dev-tiny"));
  const std::string out = tmp / "x.png";
  auto run = [&](const std::string& flags) {
    return run_cli("generate --model " + flux2 +
                   " --prompt cat --height 32 --width 32 --seed 1 --steps 1 "
                   "--max-sequence-length 64 " + flags + " -o " + quote(out));
  };
  auto pixels = [&](const std::string& flags) {
    fs::remove(out);
    const auto r = run(flags);
    EXPECT_EQ(r.code, 0) << flags << ": " << r.err;
    return r.code == 0 ? read_png(out).rgb : std::vector<uint8_t>{};
  };
  const auto base = pixels("");
  ASSERT_FALSE(base.empty());
  EXPECT_EQ(pixels("--text-encoder-out-layers 10 20 30"), base);  // Flux2Pipeline's default
  EXPECT_NE(pixels("--text-encoder-out-layers 5 15 25"), base);

  // The tiny encoder has 32 layers (hidden states 0..32).
  fs::remove(out);
  auto r = run("--text-encoder-out-layers 10 20 33");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("33"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // Two layers give 2/3 of the transformer's joint_attention_dim: a shape error, not a crash.
  r = run("--text-encoder-out-layers 10 20");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("joint_attention_dim is 96"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = run("--text-encoder-out-layers -1 20 30");
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(fs::exists(out));
}

TEST(CliFlux2Generate, OtherPipelinesRefuseTextEncoderOutLayers) {
  TempDir tmp;
  for (const std::string model : {"flux1-schnell-tiny", "sd35-medium-tiny"}) {
    const auto r = run_cli("generate --model " + quote(test::fixture_path(model)) +
                           " --prompt cat --height 32 --width 32 --steps 1 "
                           "--text-encoder-out-layers 1 2 3 -o " + quote(tmp / "f.png"));
    EXPECT_NE(r.code, 0) << model;
    EXPECT_NE(r.err.find("Flux2Pipeline"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(tmp / "f.png"));
  }
}

}  // namespace
}  // namespace tessera
