#include "tokenizers/t5_tokenizer.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/charsmap.h"
#include "tokenizers/tokenizer_config.h"
#include "tokenizers/tokenizer_json.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

namespace {

// Protobuf wire format, just enough to read a sentencepiece ModelProto.
bool read_varint(std::string_view s, size_t& p, uint64_t& v) {
  v = 0;
  for (int shift = 0; p < s.size() && shift < 64; shift += 7) {
    uint8_t b = uint8_t(s[p++]);
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

struct WireField {
  uint32_t number;
  uint32_t wire_type;
  uint64_t value;            // varint and fixed32/fixed64 fields
  std::string_view payload;  // length-delimited fields
};

std::vector<WireField> parse_fields(std::string_view s, const std::string& file) {
  std::vector<WireField> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t start = p;
    uint64_t tag, v = 0;
    bool ok = read_varint(s, p, tag);
    std::string_view payload;
    switch (tag & 7) {
      case 0:
        ok = ok && read_varint(s, p, v);
        break;
      case 1:
      case 5: {
        size_t n = (tag & 7) == 1 ? 8 : 4;
        ok = ok && p + n <= s.size();
        if (ok) std::memcpy(&v, s.data() + p, n);  // little-endian, as protobuf
        p += n;
        break;
      }
      case 2:
        ok = ok && read_varint(s, p, v) && v <= s.size() - std::min(p, s.size());
        if (ok) payload = s.substr(p, v);
        p += v;
        break;
      default:
        ok = false;
    }
    TESSERA_CHECK(ok && p <= s.size(), "[t5_tokenizer] ", file,
                  " is not a valid sentencepiece model (bad protobuf field at byte ", start, ")");
    out.push_back(WireField{uint32_t(tag >> 3), uint32_t(tag & 7), v, payload});
  }
  return out;
}

// What transformers' SentencePieceExtractor takes from spiece.model: the (piece, score) list,
// control (3) and user-defined (4) pieces as added tokens, and the normaliser's charsmap.
struct SpmModel {
  std::vector<std::pair<std::string, double>> vocab;
  std::vector<AddedToken> added;
  std::string charsmap;
};

SpmModel read_spiece(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    TESSERA_CHECK(f.good(), "[t5_tokenizer] cannot open ", file);
    std::stringstream ss;
    ss << f.rdbuf();
    bytes = ss.str();
  }
  SpmModel m;
  for (const WireField& f : parse_fields(bytes, file)) {
    if (f.number == 1 && f.wire_type == 2) {  // ModelProto.pieces
      std::string piece;
      float score = 0;
      uint64_t type = 1;  // NORMAL
      for (const WireField& g : parse_fields(f.payload, file)) {
        if (g.number == 1 && g.wire_type == 2) piece = std::string(g.payload);
        if (g.number == 2 && g.wire_type == 5) std::memcpy(&score, &g.value, 4);
        if (g.number == 3 && g.wire_type == 0) type = g.value;
      }
      if (type == 3 || type == 4) m.added.push_back(AddedToken{piece, int64_t(m.vocab.size())});
      m.vocab.emplace_back(std::move(piece), double(score));
    } else if (f.number == 3 && f.wire_type == 2) {  // ModelProto.normalizer_spec
      for (const WireField& g : parse_fields(f.payload, file))
        if (g.number == 2 && g.wire_type == 2) m.charsmap = std::string(g.payload);
    }
  }
  TESSERA_CHECK(!m.vocab.empty(), "[t5_tokenizer] ", file,
                " has no pieces, expected a sentencepiece model");
  return m;
}

}  // namespace

T5Tokenizer T5Tokenizer::from_folder(const std::filesystem::path& dir) {
  const std::filesystem::path tj_path = dir / "tokenizer.json", spm_path = dir / "spiece.model";
  const json cfg = load_tokenizer_config(dir);
  const int64_t extra_ids = cfg.value("extra_ids", int64_t(100));
  std::vector<std::pair<std::string, double>> vocab;
  std::vector<AddedToken> added;
  std::string charsmap, source;
  if (std::filesystem::exists(tj_path)) {  // transformers reads tokenizer.json first
    source = tj_path.string();
    json tj = read_json_file(tj_path);
    TESSERA_CHECK(tj.is_object() && tj.contains("model") && tj["model"].is_object() &&
                      tj["model"].value("type", "") == "Unigram",
                  "[t5_tokenizer] ", source, ": model type is '",
                  tj.is_object() && tj.contains("model") && tj["model"].is_object()
                      ? tj["model"].value("type", "")
                      : "",
                  "', expected a Unigram model");
    vocab = unigram_vocab_from_json(tj["model"], source);
    charsmap = precompiled_charsmap_from_json(tj.value("normalizer", json()), source);
    added = added_tokens_from_json(tj);
  } else {
    source = spm_path.string();
    TESSERA_CHECK(std::filesystem::exists(spm_path), "[t5_tokenizer] ", dir.string(),
                  ": no tokenizer.json and no spiece.model, expected a T5 tokenizer folder "
                  "(transformers reads tokenizer.json, else spiece.model)");
    SpmModel m = read_spiece(spm_path);
    vocab = std::move(m.vocab);
    added = std::move(m.added);
    charsmap = std::move(m.charsmap);
    // T5's converter: <extra_id_{n-1}> .. <extra_id_0> after the pieces.
    for (int64_t i = extra_ids - 1; i >= 0; --i)
      vocab.emplace_back("<extra_id_" + std::to_string(i) + ">", 0.0);
  }
  if (cfg.contains("added_tokens_decoder")) added = added_tokens_from_config(cfg);
  auto field = [&](const char* key, const char* fallback) {
    std::string v = special_token_field(cfg, key);
    return v.empty() ? std::string(fallback) : v;
  };
  const std::string eos = field("eos_token", "</s>"), unk = field("unk_token", "<unk>"),
                    pad = field("pad_token", "<pad>");
  // The class's pipeline (T5Tokenizer.__init__): unk_id 2, charsmap when there is one.
  json normalizer;
  if (!charsmap.empty())
    normalizer = json{{"type", "Precompiled"}, {"precompiled_charsmap", base64_encode(charsmap)}};
  const json pre{{"type", "Sequence"},
                 {"pretokenizers",
                  {{{"type", "WhitespaceSplit"}},
                   {{"type", "Metaspace"},
                    {"replacement", "\u2581"},
                    {"prepend_scheme", "always"},
                    {"split", true}}}}};
  T5Tokenizer tok;
  tok.vocab_size_ = int64_t(vocab.size());
  TokenizerJson pipeline =
      TokenizerJson::from_parts(normalizer, pre, UnigramModel(vocab, vocab.size() > 2 ? 2 : -1),
                                std::move(added), {}, source);
  // Then the special tokens, and the extra ids unless the config lists its own.
  std::vector<json> specials{special_token_value(cfg, "eos_token", "</s>"),
                             special_token_value(cfg, "unk_token", "<unk>"),
                             special_token_value(cfg, "pad_token", "<pad>")};
  const char* list_key =
      cfg.contains("extra_special_tokens") ? "extra_special_tokens" : "additional_special_tokens";
  bool has_sentinels = false;
  if (cfg.contains(list_key) && cfg[list_key].is_array()) {
    for (const json& t : cfg[list_key]) {
      specials.push_back(t);
      has_sentinels |= t.dump().find("<extra_id_") != std::string::npos;
    }
  }
  if (!has_sentinels)
    for (int64_t i = 0; i < extra_ids; ++i)
      specials.push_back("<extra_id_" + std::to_string(i) + ">");
  pipeline.add_tokens(special_tokens_to_add(specials));
  tok.eos_id_ = pipeline.token_id(eos);
  tok.pad_id_ = pipeline.token_id(pad);
  tok.pipeline_ = std::make_shared<const TokenizerJson>(std::move(pipeline));
  return tok;
}

std::vector<int64_t> T5Tokenizer::tokenize(std::string_view text) const {
  return pipeline_->tokenize(text);
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
