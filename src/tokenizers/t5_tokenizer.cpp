#include "tokenizers/t5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "runtime/error.h"
#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

namespace {

// Protobuf wire format, just enough to swap ModelProto.normalizer_spec (field 3).
bool read_varint(std::string_view s, size_t& p, uint64_t& v) {
  v = 0;
  for (int shift = 0; p < s.size() && shift < 64; shift += 7) {
    uint8_t b = uint8_t(s[p++]);
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

void write_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(v | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

struct WireField {
  uint32_t number;
  std::string_view raw;      // tag + payload
  std::string_view payload;  // length-delimited fields only
};

std::vector<WireField> parse_fields(std::string_view s, const std::string& file) {
  std::vector<WireField> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t start = p;
    uint64_t tag, len = 0;
    bool ok = read_varint(s, p, tag);
    std::string_view payload;
    switch (tag & 7) {
      case 0:
        ok = ok && read_varint(s, p, len);
        break;
      case 1:
        p += 8;
        break;
      case 5:
        p += 4;
        break;
      case 2:
        ok = ok && read_varint(s, p, len) && len <= s.size() - std::min(p, s.size());
        if (ok) payload = s.substr(p, len);
        p += len;
        break;
      default:
        ok = false;
    }
    TESSERA_CHECK(ok && p <= s.size(), "[t5_tokenizer] ", file,
                  " is not a valid sentencepiece model (bad protobuf field at byte ", start, ")");
    out.push_back(WireField{uint32_t(tag >> 3), s.substr(start, p - start), payload});
  }
  return out;
}

}  // namespace

// The sentencepiece charsmap (a darts-clone trie + NUL-terminated replacements) applied as
// transformers' Precompiled normaliser does it.
class T5Tokenizer::CharsMap {
 public:
  explicit CharsMap(std::string blob) : blob_(std::move(blob)) {
    if (blob_.size() < 4) return;
    uint32_t trie_bytes;
    std::memcpy(&trie_bytes, blob_.data(), 4);
    if (trie_bytes % 4 || 4 + size_t(trie_bytes) > blob_.size()) return;
    units_.resize(trie_bytes / 4);
    std::memcpy(units_.data(), blob_.data() + 4, trie_bytes);
    normalized_ = std::string_view(blob_).substr(4 + trie_bytes);
  }

  // Replacement of the shortest mapped prefix of `chunk` (which then replaces all of it).
  std::optional<std::string_view> transform(std::string_view chunk) const {
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

  // Per grapheme cluster: a cluster under 6 bytes is looked up whole, else char by char.
  std::string normalize(std::u32string_view text) const {
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

 private:
  std::string blob_;
  std::vector<uint32_t> units_;
  std::string_view normalized_;
};

T5Tokenizer::T5Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
T5Tokenizer::~T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;

int64_t T5Tokenizer::vocab_size() const {
  return sp_->GetPieceSize();
}

T5Tokenizer T5Tokenizer::from_folder(const std::filesystem::path& dir) {
  std::filesystem::path model = dir / "spiece.model";
  TESSERA_CHECK(std::filesystem::exists(model), "[t5_tokenizer] ", model.string(),
                " not found, expected a T5 tokenizer folder with spiece.model");
  std::string bytes;
  {
    std::ifstream f(model, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    bytes = ss.str();
  }
  // transformers normalises with the model's charsmap per grapheme cluster, then splits on
  // whitespace; sentencepiece would normalise differently (longest match), so tessera does the
  // normalisation and loads the model with an identity normaliser for the unigram pass.
  std::string charsmap, patched;
  for (const WireField& f : parse_fields(bytes, model.string())) {
    if (f.number != 3) {
      patched.append(f.raw);
      continue;
    }
    std::string spec;
    for (const WireField& g : parse_fields(f.payload, model.string())) {
      if (g.number == 2)
        charsmap = std::string(g.payload);
      else if (g.number != 1 && g.number != 4 && g.number != 6)
        spec.append(g.raw);  // keep add_dummy_prefix, escape_whitespaces, ...
    }
    spec += std::string("\x0a\x08identity", 10);
    spec += std::string("\x20\x00", 2);  // remove_extra_whitespaces = false
    patched.push_back(char(0x1A));
    write_varint(patched, spec.size());
    patched += spec;
  }
  T5Tokenizer tok;
  auto status = tok.sp_->LoadFromSerializedProto(patched);
  TESSERA_CHECK(status.ok(), "[t5_tokenizer] cannot load ", model.string(), ": ", status.ToString(),
                ", expected a sentencepiece model");
  tok.charsmap_ = std::make_unique<CharsMap>(std::move(charsmap));
  json cfg = json::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json"))
    cfg = read_json_file(dir / "tokenizer_config.json");
  std::string eos = special_token_field(cfg, "eos_token"),
              pad = special_token_field(cfg, "pad_token");
  if (eos.empty()) eos = "</s>";
  if (pad.empty()) pad = "<pad>";

  std::filesystem::path tj_path = dir / "tokenizer.json";
  if (std::filesystem::exists(tj_path)) {
    tok.added_ = added_tokens_from_json(read_json_file(tj_path));
  } else {
    // T5's layout: the sentencepiece pieces (pad, eos, unk first), then <extra_id_99> ..
    // <extra_id_0> at the top ids.
    int64_t n = tok.sp_->GetPieceSize();
    for (int64_t id :
         {int64_t(tok.sp_->pad_id()), int64_t(tok.sp_->eos_id()), int64_t(tok.sp_->unk_id())})
      if (id >= 0) tok.added_.push_back(AddedToken{tok.sp_->IdToPiece(int(id)), id});
    int64_t extra = cfg.value("extra_ids", 100);
    for (int64_t i = 0; i < extra; ++i)
      tok.added_.push_back(AddedToken{"<extra_id_" + std::to_string(i) + ">", n + extra - 1 - i});
  }
  auto find = [&](const std::string& s) -> int64_t {
    for (const AddedToken& t : tok.added_)
      if (t.content == s) return t.id;
    return tok.sp_->PieceToId(s);
  };
  tok.eos_id_ = find(eos);
  tok.pad_id_ = find(pad);
  return tok;
}

std::vector<int64_t> T5Tokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  std::vector<int> piece_ids;
  for (const Segment& seg : split_added_tokens(text, added_)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    // transformers splits on Unicode whitespace before the unigram model (WhitespaceSplit +
    // Metaspace); sentencepiece alone would keep e.g. U+0085 inside a word.
    std::u32string u = utf8_to_u32(charsmap_->normalize(utf8_to_u32(seg.text)));
    std::u32string word;
    auto flush = [&] {
      if (word.empty()) return;
      auto status = sp_->Encode(u32_to_utf8(word), &piece_ids);
      TESSERA_CHECK(status.ok(), "[t5_tokenizer] sentencepiece failed: ", status.ToString());
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
      word.clear();
    };
    for (char32_t c : u) {
      if (is_rust_whitespace(c))
        flush();
      else
        word.push_back(c);
    }
    flush();
  }
  return ids;
}

Encoding T5Tokenizer::encode(std::string_view text, const EncodeOptions& o) const {
  std::vector<int64_t> ids = tokenize(text);
  int64_t n_special = o.add_special_tokens ? 1 : 0;
  int64_t cut = 0;
  if (o.truncation && o.max_length > 0)
    cut = truncate_ids(ids, o.max_length, n_special, Side::right);
  if (o.add_special_tokens) ids.push_back(eos_id_);
  Encoding e = pad_encoding(std::move(ids), o.max_length, pad_id_, Side::right,
                            o.pad_to_max_length && o.max_length > 0);
  e.num_truncated = cut;
  return e;
}

Encoding T5Tokenizer::encode(std::string_view text, int64_t max_length) const {
  EncodeOptions o;
  o.max_length = max_length;
  return encode(text, o);
}

}  // namespace tessera::tokenizers
