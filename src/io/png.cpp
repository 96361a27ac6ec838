#include "io/png.h"

#include <spng.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "io/atomic_file.h"
#include "runtime/error.h"

namespace tessera {
namespace {

struct CtxDeleter {
  void operator()(spng_ctx* c) const { spng_ctx_free(c); }
};
using Ctx = std::unique_ptr<spng_ctx, CtxDeleter>;

bool is_latin1_safe_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80 || (c < 0x20 && c != '\n') || c == 0x7f) return false;
  return true;
}

// PNG keywords: 1-79 printable Latin-1 characters, no leading, trailing or double spaces.
bool valid_keyword(const std::string& k) {
  if (k.empty() || k.size() > 79 || k.front() == ' ' || k.back() == ' ') return false;
  for (size_t i = 0; i < k.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(k[i]);
    if (c < 0x20 || c > 0x7e) return false;
    if (c == ' ' && i > 0 && k[i - 1] == ' ') return false;
  }
  return true;
}

}  // namespace

std::string PngImage::text_value(const std::string& keyword) const {
  for (const auto& [k, v] : text)
    if (k == keyword) return v;
  return "";
}

PngText generation_text(const GenerationInfo& info) {
  std::ostringstream g;
  g << info.guidance;
  return {{"prompt", info.prompt},
          {"seed", std::to_string(info.seed)},
          {"steps", std::to_string(info.steps)},
          {"guidance", g.str()},
          {"size", std::to_string(info.width) + "x" + std::to_string(info.height)},
          {"model", info.model},
          {"Software", std::string("tessera ") + TESSERA_VERSION}};
}

void write_png(const std::string& path, const uint8_t* rgb, int width, int height,
               const PngText& text) {
  TESSERA_CHECK(rgb != nullptr, path, ": [png] no pixel data");
  TESSERA_CHECK(width > 0 && height > 0 && width <= (1 << 24) && height <= (1 << 24), path,
                ": [png] image size ", width, "x", height, " is not positive or too large");
  std::vector<spng_text> chunks(text.size());
  static char empty[1] = {0};
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& [key, value] = text[i];
    TESSERA_CHECK(valid_keyword(key), path, ": [png] text keyword '", key,
                  "' is invalid (expected 1-79 printable ASCII characters)");
    TESSERA_CHECK(value.find('\0') == std::string::npos, path, ": [png] text '", key,
                  "' contains a NUL byte");
    spng_text& t = chunks[i];
    std::snprintf(t.keyword, sizeof(t.keyword), "%s", key.c_str());
    t.type = is_latin1_safe_ascii(value) ? SPNG_TEXT : SPNG_ITXT;
    t.length = value.size();
    t.text = const_cast<char*>(value.c_str());
    t.compression_flag = 0;
    t.compression_method = 0;
    t.language_tag = empty;
    t.translated_keyword = empty;
  }
  Ctx ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  TESSERA_CHECK(ctx, path, ": [png] cannot create an encoder (out of memory)");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = uint32_t(width);
  ihdr.height = uint32_t(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  int err = spng_set_ihdr(ctx.get(), &ihdr);
  if (!err && !chunks.empty())
    err = spng_set_text(ctx.get(), chunks.data(), uint32_t(chunks.size()));
  const size_t bytes = size_t(width) * size_t(height) * 3;
  if (!err) err = spng_encode_image(ctx.get(), rgb, bytes, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  TESSERA_CHECK(!err, path, ": [png] encoding failed (", spng_strerror(err), ")");
  size_t png_size = 0;
  std::unique_ptr<void, decltype(&std::free)> png(spng_get_png_buffer(ctx.get(), &png_size, &err),
                                                  &std::free);
  TESSERA_CHECK(png && !err, path, ": [png] encoding failed (", spng_strerror(err), ")");
  write_file_atomically(
      path, [&](std::FILE* fp) { return std::fwrite(png.get(), 1, png_size, fp) == png_size; });
}

PngImage read_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in, path, ": cannot open");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Ctx ctx(spng_ctx_new(0));
  TESSERA_CHECK(ctx, path, ": [png] cannot create a decoder (out of memory)");
  // Bound what a corrupt header can make us allocate.
  spng_set_image_limits(ctx.get(), 1 << 16, 1 << 16);
  spng_set_chunk_limits(ctx.get(), 64u << 20, 256u << 20);
  int err = spng_set_png_buffer(ctx.get(), data.data(), data.size());
  spng_ihdr ihdr{};
  if (!err) err = spng_get_ihdr(ctx.get(), &ihdr);
  size_t size = 0;
  if (!err) err = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &size);
  TESSERA_CHECK(!err, path, ": [png] not a valid PNG (", spng_strerror(err), ")");
  PngImage img;
  img.width = int(ihdr.width);
  img.height = int(ihdr.height);
  img.rgb.resize(size);
  err = spng_decode_image(ctx.get(), img.rgb.data(), size, SPNG_FMT_RGB8, SPNG_DECODE_TRNS);
  TESSERA_CHECK(!err, path, ": [png] decoding failed (", spng_strerror(err), ")");
  uint32_t n = 0;
  err = spng_get_text(ctx.get(), nullptr, &n);
  if (!err && n > 0) {
    std::vector<spng_text> t(n);
    err = spng_get_text(ctx.get(), t.data(), &n);
    TESSERA_CHECK(!err, path, ": [png] reading text chunks failed (", spng_strerror(err), ")");
    for (uint32_t i = 0; i < n; ++i)
      img.text.emplace_back(t[i].keyword, std::string(t[i].text, t[i].length));
  }
  return img;
}

}  // namespace tessera
