#include "tokenizers/clip_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

std::u32string clip_normalize(std::u32string_view text) {
  std::u32string composed = nfc(text);
  std::u32string spaced;
  spaced.reserve(composed.size());
  for (size_t i = 0; i < composed.size();) {
    if (is_regex_space(composed[i])) {
      spaced.push_back(U' ');
      while (i < composed.size() && is_regex_space(composed[i])) ++i;
    } else {
      spaced.push_back(composed[i++]);
    }
  }
  return to_lower(spaced);
}

// <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// with behaviour "removed, inverted": matches are the pieces, the rest (spaces) is dropped.
std::vector<std::u32string> clip_split(std::u32string_view s) {
  static const std::u32string_view kLiterals[] = {
      U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = 0;
    for (std::u32string_view lit : kLiterals) {
      if (s.substr(i, lit.size()) == lit) {
        n = lit.size();
        break;
      }
    }
    if (n == 0) {
      if (is_letter(s[i])) {
        while (i + n < s.size() && is_letter(s[i + n])) ++n;
      } else if (is_number(s[i])) {
        n = 1;
      } else if (!is_regex_space(s[i])) {
        auto other = [](char32_t c) {
          return !is_regex_space(c) && !is_letter(c) && !is_number(c);
        };
        while (i + n < s.size() && other(s[i + n])) ++n;
      }
    }
    if (n == 0) {
      ++i;  // whitespace: removed
      continue;
    }
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

namespace {

std::vector<std::pair<std::string, std::string>> read_merges(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "[clip_tokenizer] cannot open ", path.string(),
                ", expected merges.txt in the tokenizer folder");
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

}  // namespace

ClipTokenizer ClipTokenizer::from_folder(const std::filesystem::path& dir) {
  std::filesystem::path vocab_path = dir / "vocab.json";
  TESSERA_CHECK(std::filesystem::exists(vocab_path), "[clip_tokenizer] ", vocab_path.string(),
                " not found, expected a CLIPTokenizer folder with vocab.json and merges.txt");
  json vj = read_json_file(vocab_path);
  TESSERA_CHECK(vj.is_object(), "[clip_tokenizer] ", vocab_path.string(),
                " is not an object token -> id");
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(vj.size());
  for (auto& [tok, id] : vj.items()) {
    TESSERA_CHECK(id.is_number_integer(), "[clip_tokenizer] ", vocab_path.string(), ": token '",
                  tok, "' has a non-integer id");
    vocab.emplace(tok, id.get<int64_t>());
  }
  json cfg = json::object();
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    std::filesystem::path p = dir / name;
    if (!std::filesystem::exists(p)) continue;
    json j = read_json_file(p);
    if (j.is_object())
      for (auto& [k, v] : j.items()) cfg[k] = v;  // tokenizer_config.json wins
  }
  auto field = [&](const char* key, const char* fallback) {
    std::string v = special_token_field(cfg, key);
    return v.empty() ? std::string(fallback) : v;
  };
  std::string bos = field("bos_token", "<|startoftext|>"),
              eos = field("eos_token", "<|endoftext|>");
  std::string unk = field("unk_token", "<|endoftext|>"), pad = field("pad_token", "<|endoftext|>");
  auto id_of = [&](const std::string& tok, const char* what) {
    auto it = vocab.find(tok);
    TESSERA_CHECK(it != vocab.end(), "[clip_tokenizer] ", what, " '", tok, "' is not in ",
                  vocab_path.string());
    return it->second;
  };
  int64_t bos_id = id_of(bos, "bos_token"), eos_id = id_of(eos, "eos_token");
  int64_t unk_id = id_of(unk, "unk_token"), pad_id = id_of(pad, "pad_token");
  std::vector<AddedToken> added;  // transformers registers bos/eos/unk/pad as raw-text specials
  for (const std::string& s : {bos, eos, unk, pad}) {
    bool dup = false;
    for (const AddedToken& t : added) dup |= t.content == s;
    if (!dup) added.push_back(AddedToken{s, vocab.at(s)});
  }
  ClipTokenizer tok(
      BpeModel(std::move(vocab), read_merges(dir / "merges.txt"), "</w>", unk_id, false));
  tok.added_ = std::move(added);
  tok.bos_id_ = bos_id;
  tok.eos_id_ = eos_id;
  tok.pad_id_ = pad_id;
  if (cfg.contains("model_max_length") && cfg["model_max_length"].is_number_integer())
    tok.max_length_ = cfg["model_max_length"].get<int64_t>();
  return tok;
}

std::vector<int64_t> ClipTokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const Segment& seg : split_added_tokens(text, added_)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    for (const std::u32string& piece : clip_split(clip_normalize(utf8_to_u32(seg.text)))) {
      std::string bytes = u32_to_utf8(piece);
      std::u32string word;
      word.reserve(bytes.size());
      for (unsigned char b : bytes) word.push_back(byte_to_unicode()[b]);
      model_.encode_word(word, ids);
    }
  }
  return ids;
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
