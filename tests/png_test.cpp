// PNG output: pixels and text chunks survive a write/read round trip; writes are atomic.
#include "io/png.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io_test_folder.h"
#include "runtime/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<uint8_t> gradient(int w, int h, int salt) {
  std::vector<uint8_t> px(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(size_t(y) * w + x) * 3 + c] = uint8_t(x * 31 + y * 17 + c * 85 + salt);
  return px;
}

TEST(Png, PixelsAndGenerationTextRoundTrip) {
  TempDir dir;
  const int w = 7, h = 5;
  const auto px = gradient(w, h, 0);
  GenerationInfo info;
  info.prompt = "a tiny red fox, watercolor";
  info.seed = 42;
  info.steps = 28;
  info.guidance = 3.5;
  info.width = w;
  info.height = h;
  info.model = "black-forest-labs/FLUX.1-dev";
  const std::string path = dir / "out.png";
  write_png(path, px.data(), w, h, generation_text(info));
  const PngImage img = read_png(path);
  EXPECT_EQ(img.width, w);
  EXPECT_EQ(img.height, h);
  EXPECT_EQ(img.rgb, px);
  EXPECT_EQ(img.text_value("prompt"), info.prompt);
  EXPECT_EQ(img.text_value("seed"), "42");
  EXPECT_EQ(img.text_value("steps"), "28");
  EXPECT_EQ(img.text_value("guidance"), "3.5");
  EXPECT_EQ(img.text_value("size"), "7x5");
  EXPECT_EQ(img.text_value("model"), "black-forest-labs/FLUX.1-dev");
  EXPECT_EQ(img.text_value("Software").rfind("tessera ", 0), 0u);
  // ASCII text is stored as plain tEXt chunks that any viewer shows.
  EXPECT_NE(test::read_text(path).find(std::string("tEXtprompt\0a tiny red fox", 24)),
            std::string::npos);
}

TEST(Png, NonAsciiTextGoesToItxtAsUtf8) {
  TempDir dir;
  const auto px = gradient(3, 2, 9);
  const std::string prompt = "caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac\nsecond line";
  write_png(dir / "u.png", px.data(), 3, 2, {{"prompt", prompt}});
  const PngImage img = read_png(dir / "u.png");
  EXPECT_EQ(img.text_value("prompt"), prompt);
  EXPECT_NE(test::read_text(dir / "u.png").find("iTXtprompt"), std::string::npos);
}

TEST(Png, AtomicWriteLeavesNoPartialFile) {
  TempDir dir;
  const auto a = gradient(4, 4, 1), b = gradient(4, 4, 2);
  // Unwritable destination (a folder that does not exist): error naming the path, no file.
  const std::string bad = dir / "missing/out.png";
  try {
    write_png(bad, a.data(), 4, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ": cannot write"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "missing"));
  // Overwrite replaces the whole image; a failed write keeps the old one and leaves no temp.
  const std::string path = dir / "img.png";
  write_png(path, a.data(), 4, 4);
  write_png(path, b.data(), 4, 4);
  EXPECT_EQ(read_png(path).rgb, b);
  EXPECT_THROW(write_png(path, a.data(), 4, 4, {{"bad\tkey", "x"}}), Error);
  EXPECT_THROW(write_png(path, a.data(), 0, 4), Error);
  EXPECT_EQ(read_png(path).rgb, b);
  size_t files = 0;
  for (const auto& de : fs::directory_iterator(dir.path())) files += de.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(Png, ReadingGarbageIsAnError) {
  TempDir dir;
  test::write_text(dir / "x.png", "not a png at all");
  EXPECT_THROW(read_png(dir / "x.png"), Error);
  EXPECT_THROW(read_png(dir / "absent.png"), Error);
}

}  // namespace
}  // namespace tessera
