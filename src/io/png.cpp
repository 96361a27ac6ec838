#include "io/png.h"

#include <spng.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "runtime/atomic_file.h"
#include "runtime/error.h"

namespace tessera {
namespace {

struct CtxDeleter {
  void operator()(spng_ctx* c) const { spng_ctx_free(c); }
};
using Ctx = std::unique_ptr<spng_ctx, CtxDeleter>;

// Printable ASCII and line feeds: a tEXt chunk (Latin-1) shows them as they are.
bool is_plain_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x7f || (c < 0x20 && c != '\n')) return false;
  return true;
}

bool is_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80                 ? 0
                     : c >= 0xc2 && c <= 0xdf ? 1
                     : c >= 0xe0 && c <= 0xef ? 2
                     : c >= 0xf0 && c <= 0xf4 ? 3
                                              : 4;
    if (n == 4 || i + n >= s.size()) return false;
    uint32_t cp = n == 0 ? c : c & (0x3f >> n);
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n + 1;
  }
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

constexpr size_t kMaxChunkLength = 0x7fffffff;  // PNG: chunk lengths are below 2^31
constexpr size_t kItxtOverhead = 5;  // NUL, compression flag and method, two empty strings' NULs

// What is wrong with `text` for a PNG, or "" when every entry can be stored.
std::string text_problem(const PngText& text) {
  for (const auto& [key, value] : text) {
    if (!valid_keyword(key))
      return detail::concat("[png] text keyword '", key,
                            "' is invalid (expected 1-79 printable ASCII characters)");
    if (value.find('\0') != std::string::npos)
      return detail::concat("[png] text '", key, "' contains a NUL byte");
    if (!is_plain_ascii(value) && !is_utf8(value))
      return detail::concat("[png] text '", key, "' is not valid UTF-8");
    if (value.size() > kMaxChunkLength - key.size() - kItxtOverhead)
      return detail::concat("[png] text '", key, "' is too long for a PNG chunk (", value.size(),
                            " bytes)");
  }
  return "";
}

// The CRC-32 of PNG chunks (ISO 3309; zlib's crc32), over the chunk type and data.
uint32_t chunk_crc(const std::string& type_and_data) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : type_and_data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

void append_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += char((v >> shift) & 0xff);
}

// One tEXt chunk for printable ASCII (an empty text included: the PNG spec allows it, libspng's
// encoder does not), else one uncompressed iTXt chunk holding the UTF-8 text.
std::string text_chunk(const std::string& key, const std::string& value) {
  const bool plain = is_plain_ascii(value);
  std::string body = plain ? "tEXt" : "iTXt";
  body += key;
  body += '\0';
  if (!plain) body.append("\0\0\0\0", 4);  // not compressed, method 0, no language, no translation
  body += value;
  std::string chunk;
  append_u32(chunk, uint32_t(body.size() - 4));
  chunk += body;
  append_u32(chunk, chunk_crc(body));
  return chunk;
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
  PngText text = {{"prompt", info.prompt}};
  if (!info.prompt_2.empty()) text.emplace_back("prompt_2", info.prompt_2);
  text.insert(text.end(), {{"seed", info.seed},
                           {"steps", std::to_string(info.steps)},
                           {"guidance", g.str()},
                           {"size", std::to_string(info.width) + "x" + std::to_string(info.height)},
                           {"model", info.model},
                           {"Software", std::string("tessera ") + TESSERA_VERSION}});
  return text;
}

void check_png_text(const PngText& text) {
  const std::string problem = text_problem(text);
  TESSERA_CHECK(problem.empty(), problem);
}

std::string encode_png(const uint8_t* rgb, int width, int height, const PngText& text,
                       const std::string& what) {
  TESSERA_CHECK(rgb != nullptr, what, ": [png] no pixel data");
  TESSERA_CHECK(width > 0 && height > 0 && width <= (1 << 24) && height <= (1 << 24), what,
                ": [png] image size ", width, "x", height, " is not positive or too large");
  const std::string problem = text_problem(text);
  TESSERA_CHECK(problem.empty(), what, ": ", problem);
  Ctx ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  TESSERA_CHECK(ctx, what, ": [png] cannot create an encoder (out of memory)");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = uint32_t(width);
  ihdr.height = uint32_t(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  int err = spng_set_ihdr(ctx.get(), &ihdr);
  const size_t bytes = size_t(width) * size_t(height) * 3;
  if (!err) err = spng_encode_image(ctx.get(), rgb, bytes, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  TESSERA_CHECK(!err, what, ": [png] encoding failed (", spng_strerror(err), ")");
  size_t png_size = 0;
  std::unique_ptr<void, decltype(&std::free)> png(spng_get_png_buffer(ctx.get(), &png_size, &err),
                                                  &std::free);
  TESSERA_CHECK(png && !err, what, ": [png] encoding failed (", spng_strerror(err), ")");
  // The text chunks go right after IHDR (signature 8 bytes, IHDR chunk 25), written here rather
  // than by libspng, whose encoder refuses empty texts.
  constexpr size_t kAfterIhdr = 33;
  const char* p = static_cast<const char*>(png.get());
  TESSERA_CHECK(png_size > kAfterIhdr && std::memcmp(p + 12, "IHDR", 4) == 0, what,
                ": [png] encoder output does not start with IHDR");
  std::string out(p, kAfterIhdr);
  for (const auto& [key, value] : text) out += text_chunk(key, value);
  out.append(p + kAfterIhdr, png_size - kAfterIhdr);
  return out;
}

void write_png(const std::string& path, const uint8_t* rgb, int width, int height,
               const PngText& text) {
  const std::string png = encode_png(rgb, width, height, text, path);
  write_file_atomically(path, [&](std::FILE* fp) {
    return std::fwrite(png.data(), 1, png.size(), fp) == png.size();
  });
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
