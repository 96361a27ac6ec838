// `tessera generate` on the tiny SD3.5-medium pipeline: the class from model_index.json, the
// StableDiffusion3Pipeline defaults in the report, --negative-prompt and --prompt-3, diffusers'
// pixels for a golden case; FLUX.1 refuses the SD3-only flags with one line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/png.h"
#include "io_test_folder.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::quote;
using test::run_cli;
using test::TempDir;

std::string sd3() {
  return quote(test::fixture_path("sd35-medium-tiny"));
}

TEST(CliSD3Generate, DefaultsFlagsAndGoldenPixels) {
  const std::string dir = std::string("goldens/sd35-medium-tiny/pipeline/cat_64x64_cfg/f32/");
  if (!test::has_fixture(dir + "tensors.safetensors")) GTEST_SKIP() << "missing " << dir;
  TempDir tmp;
  // The golden case's call: defaults for size (sample_size 8 x 8 = 64) and T5 length (256).
  const std::string report = tmp / "r.json", out = tmp / "cat.png";
  auto r = run_cli("generate --model " + sd3() +
                   " --prompt 'a photo of a cat' --seed 0 --steps 2 "
                   "--guidance 5 --report " +
                   quote(report) + " -o " + quote(out));
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(test::read_text(report));
  EXPECT_EQ(j["pipeline"], "StableDiffusion3Pipeline");
  EXPECT_EQ(j["height"], 64);
  EXPECT_EQ(j["width"], 64);
  EXPECT_EQ(j["max_sequence_length"], 256);
  const PngImage img = read_png(out);
  const auto golden = test::load_fixture(dir + "tensors.safetensors").at("image_uint8").to_ints();
  ASSERT_EQ(img.rgb.size(), golden.size());
  int64_t worst = 0;
  for (size_t i = 0; i < golden.size(); ++i)
    worst = std::max<int64_t>(worst, std::abs(int64_t(img.rgb[i]) - golden[i]));
  EXPECT_LE(worst, 2);

  // Without flags: 28 steps and guidance 7.0, StableDiffusion3Pipeline.__call__'s defaults.
  r = run_cli("generate --model " + sd3() +
              " --prompt cat --height 32 --width 32 --seed 1 "
              "--max-sequence-length 8 --report " +
              quote(report) + " -o " + quote(out));
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(test::read_text(report));
  EXPECT_EQ(j["steps"], 28);
  EXPECT_EQ(j["guidance"], 7.0);

  // The negative prompt and prompt_3 reach the pipeline: the image changes with each.
  auto pixels = [&](const std::string& flags) {
    const std::string f = tmp / "x.png";
    const auto res = run_cli("generate --model " + sd3() +
                             " --prompt cat --height 32 --width 32 "
                             "--seed 1 --steps 1 --max-sequence-length 8 " +
                             flags + " -o " + quote(f));
    EXPECT_EQ(res.code, 0) << res.err;
    return res.code == 0 ? read_png(f).rgb : std::vector<uint8_t>{};
  };
  const auto base = pixels("");
  EXPECT_NE(pixels("--negative-prompt blurry"), base);
  EXPECT_NE(pixels("--prompt-3 'a dog'"), base);
  EXPECT_EQ(pixels("--negative-prompt ''"), base);  // empty: diffusers' default ""
}

TEST(CliSD3Generate, FluxRefusesSd3OnlyFlags) {
  TempDir tmp;
  const std::string flux = quote(test::fixture_path("flux1-schnell-tiny"));
  for (const std::string flag : {"--prompt-3 dog", "--negative-prompt blurry"}) {
    const auto r = run_cli("generate --model " + flux +
                           " --prompt cat --height 32 --width 32 "
                           "--steps 1 " +
                           flag + " -o " + quote(tmp / "f.png"));
    EXPECT_NE(r.code, 0) << flag;
    EXPECT_NE(r.err.find("[FluxPipeline]"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(tmp / "f.png"));
  }
}

}  // namespace
}  // namespace tessera
