#include "tokenizers/charsmap.h"

#include <cstring>

#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

PrecompiledCharsMap::PrecompiledCharsMap(std::string blob) : blob_(std::move(blob)) {
  if (blob_.size() < 4) return;
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob_.data(), 4);
  if (trie_bytes % 4 || 4 + size_t(trie_bytes) > blob_.size()) return;
  units_.resize(trie_bytes / 4);
  std::memcpy(units_.data(), blob_.data() + 4, trie_bytes);
  normalized_ = std::string_view(blob_).substr(4 + trie_bytes);
}

std::optional<std::string_view> PrecompiledCharsMap::transform(std::string_view chunk) const {
  if (units_.empty()) return std::nullopt;
  auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  size_t pos = offset(units_[0]);
  for (unsigned char c : chunk) {
    pos ^= c;
    if (pos >= units_.size()) return std::nullopt;
    uint32_t u = units_[pos];
    if ((u & ((1u << 31) | 0xFF)) != c) return std::nullopt;
    pos ^= offset(u);
    if (pos >= units_.size()) return std::nullopt;
    if ((u >> 8) & 1) {
      size_t start = units_[pos] & ((1u << 31) - 1);
      if (start >= normalized_.size()) return std::nullopt;
      size_t end = normalized_.find('\0', start);
      return normalized_.substr(start, end == std::string_view::npos ? end : end - start);
    }
  }
  return std::nullopt;
}

std::string PrecompiledCharsMap::normalize(std::u32string_view text) const {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    size_t e = grapheme_end(text, i);
    std::string g = u32_to_utf8(text.substr(i, e - i));
    std::optional<std::string_view> whole;
    if (g.size() < 6) whole = transform(g);
    if (whole) {
      out += *whole;
    } else {
      for (size_t k = i; k < e; ++k) {
        std::string c;
        append_utf8(c, text[k]);
        std::optional<std::string_view> m = transform(c);
        out += m ? std::string(*m) : c;
      }
    }
    i = e;
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] != '='; ++i) {
    int v = value(text[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  for (; i < text.size(); ++i)
    if (text[i] != '=') return std::nullopt;
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 2]));
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kAlphabet[v & 63] : '=');
  }
  return out;
}

}  // namespace tessera::tokenizers
