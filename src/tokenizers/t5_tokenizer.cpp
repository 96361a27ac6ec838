#include "tokenizers/t5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

namespace {
// Rust's char::is_whitespace set, which transformers' WhitespaceSplit splits on.
constexpr char32_t kWhitespace[] = {0x9,    0xA,    0xB,    0xC,    0xD,    0x20,   0x85,
                                    0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028,
                                    0x2029, 0x202F, 0x205F, 0x3000};
}  // namespace

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
  T5Tokenizer tok;
  auto status = tok.sp_->Load(model.string());
  TESSERA_CHECK(status.ok(), "[t5_tokenizer] cannot load ", model.string(), ": ", status.ToString(),
                ", expected a sentencepiece model");
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
  // transformers normalises before it splits on whitespace: a whitespace character that the
  // model's normaliser deletes (e.g. U+000B under nmt_nfkc) joins its neighbours; any other
  // (mapped to a space, or kept as is like U+0085) splits. Ask the model which it deletes.
  auto encode = [&](const std::string& s) {
    std::vector<int> ids;
    tok.sp_->Encode(s, &ids);
    return ids;
  };
  const std::vector<int> joined = encode("ab");
  for (char32_t c : kWhitespace) {
    std::string probe = "a";
    append_utf8(probe, c);
    probe += "b";
    std::vector<int> ids = encode(probe);
    if (ids == joined) tok.deleted_whitespace_.insert(c);
  }
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
    std::u32string u = utf8_to_u32(seg.text);
    std::u32string word;
    auto flush = [&] {
      if (word.empty()) return;
      auto status = sp_->Encode(u32_to_utf8(word), &piece_ids);
      TESSERA_CHECK(status.ok(), "[t5_tokenizer] sentencepiece failed: ", status.ToString());
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
      word.clear();
    };
    for (char32_t c : u) {
      if (!is_rust_whitespace(c))
        word.push_back(c);
      else if (!deleted_whitespace_.count(c))
        flush();
    }
    flush();
  }
  return ids;
}

Encoding T5Tokenizer::encode(std::string_view text, const EncodeOptions& o) const {
  std::vector<int64_t> ids = tokenize(text);
  int64_t n_special = o.add_special_tokens ? 1 : 0;
  if (o.truncation && o.max_length > 0) truncate_ids(ids, o.max_length, n_special, Side::right);
  if (o.add_special_tokens) ids.push_back(eos_id_);
  return pad_encoding(std::move(ids), o.max_length, pad_id_, Side::right,
                      o.pad_to_max_length && o.max_length > 0);
}

Encoding T5Tokenizer::encode(std::string_view text, int64_t max_length) const {
  EncodeOptions o;
  o.max_length = max_length;
  return encode(text, o);
}

}  // namespace tessera::tokenizers
