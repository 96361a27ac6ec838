// PNG output: pixels and text chunks survive a write/read round trip; writes are atomic.
#include "io/png.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io_test_folder.h"
#include "runtime/error.h"
#include "test_util.h"

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
  info.seed = "42";
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

// Every chunk of a PNG file, with its CRC checked by a bitwise CRC-32 (independent of the
// writer's table): type -> data, in file order.
std::vector<std::pair<std::string, std::string>> chunks_of(const std::string& file) {
  const std::string png = test::read_text(file);
  EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
  std::vector<std::pair<std::string, std::string>> chunks;
  size_t at = 8;
  const auto u32 = [&](size_t i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v = (v << 8) | static_cast<unsigned char>(png[i + k]);
    return v;
  };
  while (at + 12 <= png.size()) {
    const uint32_t length = u32(at);
    if (at + 12 + length > png.size()) break;
    const std::string type_and_data = png.substr(at + 4, 4 + length);
    uint32_t crc = 0xffffffffu;
    for (unsigned char b : type_and_data) {
      crc ^= b;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
    }
    EXPECT_EQ(crc ^ 0xffffffffu, u32(at + 8 + length)) << type_and_data.substr(0, 4);
    chunks.emplace_back(type_and_data.substr(0, 4), type_and_data.substr(4));
    at += 12 + length;
  }
  EXPECT_EQ(at, png.size());
  return chunks;
}

bool has_keyword(const PngImage& img, const std::string& keyword) {
  for (const auto& [k, v] : img.text)
    if (k == keyword) return true;
  return false;
}

// An empty text (an empty prompt) is a tEXt chunk with no text after the keyword's NUL, which
// the PNG spec allows and readers (libspng, PIL, libpng) read back as "".
TEST(Png, EmptyTextIsAnEmptyTextChunk) {
  TempDir dir;
  const auto px = gradient(3, 2, 4);
  write_png(dir / "e.png", px.data(), 3, 2, {{"prompt", ""}, {"seed", "0"}, {"model", ""}});
  const PngImage img = read_png(dir / "e.png");
  EXPECT_EQ(img.rgb, px);
  ASSERT_EQ(img.text.size(), 3u);
  EXPECT_EQ(img.text[0], (std::pair<std::string, std::string>{"prompt", ""}));
  EXPECT_EQ(img.text[1], (std::pair<std::string, std::string>{"seed", "0"}));
  EXPECT_EQ(img.text[2], (std::pair<std::string, std::string>{"model", ""}));
  const auto chunks = chunks_of(dir / "e.png");
  ASSERT_GE(chunks.size(), 6u);
  EXPECT_EQ(chunks[0].first, "IHDR");
  EXPECT_EQ(chunks[1], (std::pair<std::string, std::string>{"tEXt", std::string("prompt\0", 7)}));
  EXPECT_EQ(chunks.back().first, "IEND");
}

// Text of any length in UTF-8, control characters included, round-trips: ASCII without control
// characters in tEXt, the rest in uncompressed iTXt (tEXt is Latin-1, prompts are UTF-8).
TEST(Png, LongAndControlTextRoundTrips) {
  TempDir dir;
  const auto px = gradient(2, 2, 7);
  std::string long_text = "\xf0\x9f\x90\x88 cat\ttab\r\n";
  while (long_text.size() < 300000) long_text += long_text;
  const PngText text = {{"prompt", long_text},
                        {"tab", "a\tb"},
                        {"ascii", std::string(100000, 'x')},
                        {"Key With Spaces", "\xc3\xa9"}};
  write_png(dir / "l.png", px.data(), 2, 2, text);
  EXPECT_EQ(read_png(dir / "l.png").text, text);
  const auto chunks = chunks_of(dir / "l.png");
  std::vector<std::string> types;
  for (const auto& c : chunks) types.push_back(c.first);
  EXPECT_EQ(types[1], "iTXt");
  EXPECT_EQ(types[2], "iTXt");
  EXPECT_EQ(types[3], "tEXt");
  EXPECT_EQ(types[4], "iTXt");
  // iTXt: keyword, NUL, not compressed, method 0, empty language tag and translated keyword.
  EXPECT_EQ(chunks[2].second, std::string("tab\0\0\0\0\0a\tb", 11));
}

// Text a PNG cannot hold is refused before anything is written, naming the keyword.
TEST(Png, UnstorableTextIsRefusedUpFront) {
  EXPECT_NO_THROW(check_png_text({{"prompt", ""}, {"prompt_2", "\xe6\x9d\xb1"}}));
  for (const std::string bad : {std::string("\xff"), std::string("\xc3"),
                                std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                                std::string("\xf4\x90\x80\x80"), std::string("ab\0c", 4)}) {
    const std::string msg = test::error_message([&] { check_png_text({{"prompt", bad}}); });
    EXPECT_NE(msg.find("[png] text 'prompt'"), std::string::npos) << msg;
  }
  EXPECT_NE(test::error_message([] { check_png_text({{"", "x"}}); }).find("keyword"),
            std::string::npos);
  TempDir dir;
  const auto px = gradient(2, 2, 1);
  EXPECT_THROW(write_png(dir / "b.png", px.data(), 2, 2, {{"prompt", "\xff"}}), Error);
  EXPECT_FALSE(fs::exists(dir / "b.png"));
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
