// tools/judge_shapes on procedurally drawn images (the training data's generator, in C++):
// every shape, colour and background, one and two shapes, small and large.
#include "judge_shapes.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "io/png.h"
#include "io_test_folder.h"
#include "runtime/error.h"

namespace tessera::judge {
namespace {

std::string article(const std::string& colour) {
  return colour == "orange" ? "an " : "a ";
}

TEST(JudgeShapes, ParsesPrompts) {
  Request r = parse_prompt("a red circle on a white background");
  EXPECT_EQ(r.colour, "red");
  EXPECT_EQ(r.shape, "circle");
  EXPECT_EQ(r.background, "white");
  EXPECT_EQ(r.count, 1);
  r = parse_prompt("Two blue squares");
  EXPECT_EQ(r.colour, "blue");
  EXPECT_EQ(r.shape, "square");
  EXPECT_EQ(r.background, "");
  EXPECT_EQ(r.count, 2);
  r = parse_prompt("two white stars on a grey background");
  EXPECT_EQ(r.colour, "white");
  EXPECT_EQ(r.background, "gray");
  EXPECT_THROW(parse_prompt("a golden retriever surfing a wave"), Error);
}

TEST(JudgeShapes, JudgesEveryShapeColourAndBackground) {
  const std::vector<std::string> fgs = {"red",    "green",  "blue",  "yellow",
                                        "orange", "purple", "white", "black"};
  const std::vector<std::string> bgs = {"white", "black", "gray", "yellow", "blue"};
  int cases = 0;
  for (const std::string& shape : shape_names())
    for (const std::string& fg : fgs)
      for (const std::string& bg : bgs) {
        if (fg == bg) continue;
        for (double r : {6.5, 9.0, 17.0}) {
          const double cx = 20 + (cases * 7) % 24, cy = 22 + (cases * 5) % 20;
          const auto img = draw_shapes(64, 64, fg, bg, {{shape, cx, cy, r}});
          const Verdict v = judge_image(
              img.data(), 64, 64,
              parse_prompt(article(fg) + fg + " " + shape + " on a " + bg + " background"));
          EXPECT_TRUE(v.colour_ok && v.shape_ok && v.count_ok && v.background_ok)
              << shape << " " << fg << " on " << bg << " r=" << r << ": " << verdict_text(v);
          ++cases;
        }
      }
  EXPECT_EQ(cases, 4 * 36 * 3);
}

TEST(JudgeShapes, CountsTwoShapes) {
  const auto img =
      draw_shapes(64, 64, "purple", "white", {{"triangle", 16, 18, 8}, {"triangle", 44, 42, 9}});
  const Verdict v = judge_image(img.data(), 64, 64, parse_prompt("two purple triangles"));
  EXPECT_TRUE(v.colour_ok && v.shape_ok && v.count_ok) << verdict_text(v);
  ASSERT_EQ(v.components.size(), 2u);
  const Verdict one = judge_image(img.data(), 64, 64, parse_prompt("a purple triangle"));
  EXPECT_FALSE(one.count_ok);
}

TEST(JudgeShapes, RejectsWrongColourShapeAndEmptyImages) {
  const auto img = draw_shapes(64, 64, "red", "white", {{"circle", 32, 30, 12}});
  Verdict v = judge_image(img.data(), 64, 64, parse_prompt("a blue circle"));
  EXPECT_FALSE(v.colour_ok);
  EXPECT_TRUE(v.shape_ok);
  v = judge_image(img.data(), 64, 64, parse_prompt("a red star on a black background"));
  EXPECT_TRUE(v.colour_ok);
  EXPECT_FALSE(v.shape_ok);
  EXPECT_FALSE(v.background_ok);
  const auto blank = draw_shapes(64, 64, "red", "gray", {});
  v = judge_image(blank.data(), 64, 64, parse_prompt("a red square"));
  EXPECT_FALSE(v.colour_ok || v.shape_ok || v.count_ok);
  // Noise: many components, not a shape.
  std::vector<uint8_t> noise(64 * 64 * 3);
  uint32_t s = 1;
  for (auto& b : noise) b = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
  v = judge_image(noise.data(), 64, 64, parse_prompt("a red square"));
  EXPECT_FALSE(v.colour_ok && v.shape_ok && v.count_ok) << verdict_text(v);
}

#ifdef TESSERA_JUDGE_PATH
// The executable: the prompt from the PNG's text chunk, --json, and errors with exit codes.
TEST(JudgeShapes, CommandLine) {
  tessera::test::TempDir tmp;  // unique per process: ctest runs this binary several times at once
  const std::filesystem::path dir = tmp.path();
  const std::string png = (dir / "star.png").string();
  const auto img = draw_shapes(64, 64, "yellow", "black", {{"star", 30, 34, 15}});
  write_png(png, img.data(), 64, 64, {{"prompt", "a yellow star on a black background"}});
  const auto run = [](const std::string& args, int* rc) {
    std::string out;
    FILE* f = popen((std::string(TESSERA_JUDGE_PATH) + " " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
    *rc = WEXITSTATUS(pclose(f));
    return out;
  };
  int rc = -1;
  std::string out = run("--json '" + png + "'", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"colour_ok\":true,\"shape_ok\":true"), std::string::npos) << out;
  out = run("--prompt 'a red square' '" + png + "'", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("colour WRONG, shape WRONG"), std::string::npos) << out;
  out = run("'" + (dir / "missing.png").string() + "'", &rc);
  EXPECT_EQ(rc, 1) << out;
  out = run("--prompt 'a dog' '" + png + "'", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("names no known colour and shape"), std::string::npos) << out;
  out = run("", &rc);
  EXPECT_EQ(rc, 2);
}
#endif

}  // namespace
}  // namespace tessera::judge
