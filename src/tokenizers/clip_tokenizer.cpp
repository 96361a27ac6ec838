#include "tokenizers/clip_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tokenizers/tokenizer_config.h"
#include "tokenizers/tokenizer_json.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

// <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
size_t clip_match(std::u32string_view s, size_t i) {
  static const std::u32string_view kLiterals[] = {
      U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  for (std::u32string_view lit : kLiterals)
    if (s.substr(i, lit.size()) == lit) return lit.size();
  size_t n = 0;
  if (is_letter(s[i])) {
    while (i + n < s.size() && is_letter(s[i + n])) ++n;
  } else if (is_number(s[i])) {
    n = 1;
  } else {
    auto other = [](char32_t c) { return !is_regex_space(c) && !is_letter(c) && !is_number(c); };
    while (i + n < s.size() && other(s[i + n])) ++n;
  }
  return n;
}

namespace {

std::vector<std::pair<std::string, std::string>> read_merges(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "[clip_tokenizer] cannot open ", path.string(),
                ", expected merges.txt beside vocab.json in the tokenizer folder");
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  bool first = true;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (first && line.rfind("#version", 0) == 0) {
      first = false;
      continue;
    }
    first = false;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    TESSERA_CHECK(sp != std::string::npos && sp > 0, "[clip_tokenizer] ", path.string(),
                  ": merge line '", line, "' is not 'left right'");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return merges;
}

// The normaliser and pre-tokeniser CLIPTokenizer.__init__ builds, whatever the file holds.
json clip_normalizer() {
  return json{{"type", "Sequence"},
              {"normalizers",
               {{{"type", "NFC"}},
                {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                {{"type", "Lowercase"}}}}};
}

json clip_pre_tokenizer() {
  return json{{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", std::string(kClipPattern)}}},
                 {"behavior", "Removed"},
                 {"invert", true}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
}

}  // namespace

ClipTokenizer ClipTokenizer::from_folder(const std::filesystem::path& dir) {
  const std::filesystem::path tj_path = dir / "tokenizer.json", vocab_path = dir / "vocab.json";
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added;
  std::string source;
  if (std::filesystem::exists(tj_path)) {  // transformers reads tokenizer.json first
    source = tj_path.string();
    json tj = read_json_file(tj_path);
    TESSERA_CHECK(tj.is_object() && tj.contains("model"), "[clip_tokenizer] ", source,
                  " has no \"model\", expected a tokenizer.json");
    bpe_vocab_from_json(tj["model"], source, vocab, merges);
    added = added_tokens_from_json(tj);
  } else {
    source = vocab_path.string();
    TESSERA_CHECK(std::filesystem::exists(vocab_path), "[clip_tokenizer] ", dir.string(),
                  ": no tokenizer.json and no vocab.json, expected a CLIPTokenizer folder "
                  "(transformers reads tokenizer.json, else vocab.json and merges.txt)");
    json vj = read_json_file(vocab_path);
    TESSERA_CHECK(vj.is_object(), "[clip_tokenizer] ", source, " is not an object token -> id");
    vocab.reserve(vj.size());
    for (auto& [tok, id] : vj.items()) {
      TESSERA_CHECK(id.is_number_integer(), "[clip_tokenizer] ", source, ": token '", tok,
                    "' has a non-integer id");
      vocab.emplace(tok, id.get<int64_t>());
    }
    merges = read_merges(dir / "merges.txt");
  }
  const json cfg = load_tokenizer_config(dir);
  if (cfg.contains("added_tokens_decoder")) added = added_tokens_from_config(cfg);
  auto field = [&](const char* key, const char* fallback) {
    std::string v = special_token_field(cfg, key);
    return v.empty() ? std::string(fallback) : v;
  };
  std::string bos = field("bos_token", "<|startoftext|>"),
              eos = field("eos_token", "<|endoftext|>");
  std::string unk = field("unk_token", "<|endoftext|>"), pad = field("pad_token", "<|endoftext|>");
  auto id_of = [&](const std::string& tok, const char* what) {
    auto it = vocab.find(tok);
    TESSERA_CHECK(it != vocab.end(), "[clip_tokenizer] ", what, " '", tok, "' is not in ", source);
    return it->second;
  };
  ClipTokenizer tok;
  tok.bos_id_ = id_of(bos, "bos_token");
  tok.eos_id_ = id_of(eos, "eos_token");
  tok.pad_id_ = id_of(pad, "pad_token");
  int64_t unk_id = id_of(unk, "unk_token");
  TokenizerJson pipeline = TokenizerJson::from_parts(
      clip_normalizer(), clip_pre_tokenizer(),
      BpeModel(std::move(vocab), merges, "</w>", unk_id, false), std::move(added),
      PostProcessor{{tok.bos_id_}, {tok.eos_id_}}, source);
  // transformers adds bos/eos/unk/pad as special tokens when not already added (raw-text unless
  // the config's object says normalized); this matters for SD3's tokenizer_2, whose pad "!"
  // (id 0) turns every "!" of a prompt into id 0.
  pipeline.add_tokens(
      special_tokens_to_add({special_token_value(cfg, "bos_token", "<|startoftext|>"),
                             special_token_value(cfg, "eos_token", "<|endoftext|>"),
                             special_token_value(cfg, "unk_token", "<|endoftext|>"),
                             special_token_value(cfg, "pad_token", "<|endoftext|>")}));
  tok.pipeline_ = std::make_shared<const TokenizerJson>(std::move(pipeline));
  if (cfg.contains("model_max_length") && cfg["model_max_length"].is_number_integer())
    tok.max_length_ = cfg["model_max_length"].get<int64_t>();
  return tok;
}

std::vector<int64_t> ClipTokenizer::tokenize(std::string_view text) const {
  return pipeline_->tokenize(text);
}

Encoding ClipTokenizer::encode(std::string_view text, EncodeOptions o) const {
  if (o.max_length == 0) o.max_length = max_length_;
  std::vector<int64_t> ids = tokenize(text);
  int64_t n_special = o.add_special_tokens ? 2 : 0;
  int64_t cut = 0;
  if (o.truncation) cut = truncate_ids(ids, o.max_length, n_special, Side::right);
  if (o.add_special_tokens) {
    ids.insert(ids.begin(), bos_id_);
    ids.push_back(eos_id_);
  }
  Encoding e =
      pad_encoding(std::move(ids), o.max_length, pad_id_, Side::right, o.pad_to_max_length);
  e.num_truncated = cut;
  return e;
}

}  // namespace tessera::tokenizers
