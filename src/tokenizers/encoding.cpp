#include "tokenizers/encoding.h"

#include "runtime/error.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {
namespace {

// Decodes the UTF-8 code point starting at s[i]; returns its byte length (1 for bad bytes).
size_t cp_at(std::string_view s, size_t i, char32_t* out) {
  size_t len = 1;
  uint8_t b = uint8_t(s[i]);
  if (b >= 0xF0)
    len = 4;
  else if (b >= 0xE0)
    len = 3;
  else if (b >= 0xC0)
    len = 2;
  if (i + len > s.size()) len = 1;
  std::u32string cp = utf8_to_u32(s.substr(i, len));
  *out = cp.size() == 1 ? cp[0] : 0xFFFD;
  return cp.size() == 1 ? len : 1;
}

// Byte length of the code point that ends at s[i-1].
size_t cp_before(std::string_view s, size_t i) {
  size_t j = i - 1;
  while (j > 0 && (uint8_t(s[j]) & 0xC0) == 0x80 && i - j < 4) --j;
  return i - j;
}

bool whitespace_before(std::string_view s, size_t i, size_t* len) {
  if (i == 0) return false;
  *len = cp_before(s, i);
  char32_t c;
  cp_at(s, i - *len, &c);
  return is_rust_whitespace(c);
}

bool is_word_char(char32_t c) {
  return is_letter(c) || is_number(c) || is_mark(c) || c == '_';
}

}  // namespace

std::vector<Segment> split_added_tokens(std::string_view text,
                                        const std::vector<AddedToken>& tokens) {
  std::vector<Segment> out;
  size_t plain_start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* best = nullptr;
    for (const AddedToken& t : tokens) {
      if (t.normalized || t.content.empty()) continue;
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (best && best->content.size() >= t.content.size()) continue;
      if (t.single_word) {
        char32_t c;
        size_t n;
        if (i > 0) {
          n = cp_before(text, i);
          cp_at(text, i - n, &c);
          if (is_word_char(c)) continue;
        }
        size_t e = i + t.content.size();
        if (e < text.size()) {
          cp_at(text, e, &c);
          if (is_word_char(c)) continue;
        }
      }
      best = &t;
    }
    if (!best) {
      ++i;
      continue;
    }
    size_t start = i, end = i + best->content.size();
    if (best->lstrip) {
      size_t n;
      while (start > plain_start && whitespace_before(text, start, &n)) start -= n;
    }
    if (best->rstrip) {
      char32_t c;
      while (end < text.size()) {
        size_t n = cp_at(text, end, &c);
        if (!is_rust_whitespace(c)) break;
        end += n;
      }
    }
    if (start > plain_start)
      out.push_back(Segment{std::string(text.substr(plain_start, start - plain_start)), -1});
    out.push_back(Segment{best->content, best->id});
    plain_start = i = end;
  }
  if (plain_start < text.size()) out.push_back(Segment{std::string(text.substr(plain_start)), -1});
  return out;
}

int64_t truncate_ids(std::vector<int64_t>& ids, int64_t max_length, int64_t n_special, Side side) {
  int64_t keep = std::max<int64_t>(0, max_length - n_special);
  int64_t cut = int64_t(ids.size()) - keep;
  if (cut <= 0) return 0;
  if (side == Side::right)
    ids.resize(keep);
  else
    ids.erase(ids.begin(), ids.end() - keep);
  return cut;
}

Encoding pad_encoding(std::vector<int64_t> ids, int64_t max_length, int64_t pad_id, Side side,
                      bool pad) {
  Encoding e;
  int64_t n = int64_t(ids.size());
  int64_t fill = pad && max_length > n ? max_length - n : 0;
  e.ids.reserve(n + fill);
  e.attention_mask.reserve(n + fill);
  if (side == Side::left) {
    e.ids.assign(fill, pad_id);
    e.attention_mask.assign(fill, 0);
  }
  e.ids.insert(e.ids.end(), ids.begin(), ids.end());
  e.attention_mask.insert(e.attention_mask.end(), n, 1);
  if (side == Side::right) {
    e.ids.insert(e.ids.end(), fill, pad_id);
    e.attention_mask.insert(e.attention_mask.end(), fill, 0);
  }
  return e;
}

std::pair<Tensor, Tensor> to_tensors(const std::vector<Encoding>& batch) {
  TESSERA_CHECK(!batch.empty(),
                "[tokenizer] to_tensors got an empty batch, expected >= 1 encoding");
  size_t len = batch[0].ids.size();
  std::vector<int64_t> ids, mask;
  for (const Encoding& e : batch) {
    TESSERA_CHECK(e.ids.size() == len,
                  "[tokenizer] to_tensors needs equal lengths (pad to "
                  "max_length), got ",
                  e.ids.size(), " and ", len);
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    mask.insert(mask.end(), e.attention_mask.begin(), e.attention_mask.end());
  }
  Shape shape{int64_t(batch.size()), int64_t(len)};
  return {Tensor::from_ints(ids, shape, DType::i64), Tensor::from_ints(mask, shape, DType::i64)};
}

}  // namespace tessera::tokenizers
