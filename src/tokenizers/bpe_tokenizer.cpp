#include "tokenizers/bpe_tokenizer.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "tokenizers/tokenizer_json.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? char32_t(b) : extra++;
    }
    return t;
  }();
  return table;
}

BpeModel::BpeModel(std::unordered_map<std::string, int64_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   std::string end_of_word_suffix, int64_t unk_id, bool ignore_merges,
                   bool fuse_unk)
    : vocab_(std::move(vocab)),
      suffix_(std::move(end_of_word_suffix)),
      unk_id_(unk_id),
      ignore_merges_(ignore_merges),
      fuse_unk_(fuse_unk) {
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    int64_t ia = token_id(a), ib = token_id(b), im = token_id(a + b);
    TESSERA_CHECK(ia >= 0 && ib >= 0 && im >= 0, "[bpe] merge '", a, " ", b,
                  "' uses a token missing from the vocabulary, expected all three in it");
    uint64_t key = (uint64_t(ia) << 32) | uint64_t(ib);
    merges_.emplace(key, std::make_pair(int32_t(r), im));  // first (lowest) rank wins
  }
}

int64_t BpeModel::token_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::u32string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string whole = u32_to_utf8(word) + suffix_;
    if (int64_t id = token_id(whole); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<int64_t> sym;
  sym.reserve(word.size());
  bool prev_unk = false;
  for (size_t i = 0; i < word.size(); ++i) {
    std::string s;
    append_utf8(s, word[i]);
    if (i + 1 == word.size()) s += suffix_;
    int64_t id = token_id(s);
    const bool unknown = id < 0;
    if (unknown) {
      TESSERA_CHECK(unk_id_ >= 0, "[bpe] character U+", std::hex, uint32_t(word[i]),
                    " is not in the vocabulary and the model has no unk_token");
      if (fuse_unk_ && prev_unk) continue;
      id = unk_id_;
    }
    prev_unk = unknown;
    sym.push_back(id);
  }
  // Repeatedly merge the lowest-ranked adjacent pair, leftmost first (tokenizers' order).
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    int64_t merged = -1;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges_.find((uint64_t(sym[i]) << 32) | uint64_t(sym[i + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best = i;
        merged = it->second.second;
      }
    }
    if (merged < 0) break;
    sym[best] = merged;
    sym.erase(sym.begin() + best + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "[tokenizer] cannot open ", path.string(),
                ", expected the file to exist");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    TESSERA_FAIL("[tokenizer] ", path.string(), " is not valid JSON: ", e.what());
  }
}

std::string special_token_field(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

void bpe_vocab_from_json(const json& model, const std::string& file,
                         std::unordered_map<std::string, int64_t>& vocab,
                         std::vector<std::pair<std::string, std::string>>& merges) {
  TESSERA_CHECK(model.is_object() && model.value("type", "BPE") == "BPE", "[bpe] ", file,
                ": model.type is '", model.is_object() ? model.value("type", "") : "",
                "', expected 'BPE'");
  TESSERA_CHECK(model.contains("vocab") && model["vocab"].is_object(), "[bpe] ", file,
                ": model.vocab missing, expected an object token -> id");
  vocab.clear();
  merges.clear();
  vocab.reserve(model["vocab"].size());
  for (auto& [tok, id] : model["vocab"].items()) {
    TESSERA_CHECK(id.is_number_integer(), "[bpe] ", file, ": token '", tok,
                  "' has a non-integer id");
    vocab.emplace(tok, id.get<int64_t>());
  }
  if (!model.contains("merges")) return;
  merges.reserve(model["merges"].size());
  for (const json& m : model["merges"]) {
    if (m.is_string()) {  // older format: "a b"
      std::string s = m.get<std::string>();
      size_t sp = s.find(' ', 1);
      TESSERA_CHECK(sp != std::string::npos, "[bpe] ", file, ": merge '", s,
                    "' has no space, expected 'left right'");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      TESSERA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), "[bpe] ",
                    file, ": a merge is neither \"a b\" nor [a, b]");
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
}

BpeModel bpe_model_from_json(const json& model, const std::string& file) {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bpe_vocab_from_json(model, file, vocab, merges);
  auto flag = [&](const char* key) {
    return model.contains(key) && model[key].is_boolean() && model[key].get<bool>();
  };
  int64_t unk = -1;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab.find(model["unk_token"].get<std::string>());
    if (it != vocab.end()) unk = it->second;
  }
  auto str = [&](const char* key) {
    return model.contains(key) && model[key].is_string() ? model[key].get<std::string>() : "";
  };
  TESSERA_CHECK(!flag("byte_fallback"), "[bpe] ", file,
                ": BPE with byte_fallback=true is not supported, expected byte-level BPE");
  TESSERA_CHECK(str("continuing_subword_prefix").empty(), "[bpe] ", file,
                ": BPE continuing_subword_prefix '", str("continuing_subword_prefix"),
                "' is not supported, expected null or \"\"");
  TESSERA_CHECK(!model.contains("dropout") || model["dropout"].is_null() ||
                    (model["dropout"].is_number() && model["dropout"].get<double>() == 0.0),
                "[bpe] ", file, ": BPE dropout is random, expected null");
  return BpeModel(std::move(vocab), merges, str("end_of_word_suffix"), unk, flag("ignore_merges"),
                  flag("fuse_unk"));
}

std::vector<AddedToken> added_tokens_from_json(const json& tj) {
  std::vector<AddedToken> out;
  if (!tj.contains("added_tokens") || !tj["added_tokens"].is_array()) return out;
  for (const json& a : tj["added_tokens"]) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = a.at("id").get<int64_t>();
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    t.normalized = a.value("normalized", false);
    t.special = a.value("special", true);
    out.push_back(t);
  }
  return out;
}

PostProcessor post_processor_from_json(const json& post, const std::string& file) {
  PostProcessor p;
  if (post.is_null()) return p;
  std::string type = post.value("type", "");
  if (type == "Sequence") {
    for (const json& step : post.at("processors")) {
      PostProcessor q = post_processor_from_json(step, file);
      p.prefix.insert(p.prefix.end(), q.prefix.begin(), q.prefix.end());
      p.suffix.insert(p.suffix.end(), q.suffix.begin(), q.suffix.end());
    }
  } else if (type == "ByteLevel") {
    // Offsets only; no tokens.
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const json& item : post.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& spec = post.at("special_tokens").at(name);
      for (const json& id : spec.at("ids"))
        (seen_a ? p.suffix : p.prefix).push_back(id.get<int64_t>());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    p.prefix.push_back(post.at("cls").at(1).get<int64_t>());
    p.suffix.push_back(post.at("sep").at(1).get<int64_t>());
  } else {
    TESSERA_FAIL("[tokenizer] ", file, ": post_processor type '", type,
                 "' is not supported, expected TemplateProcessing, RobertaProcessing, "
                 "BertProcessing, ByteLevel, Sequence or null");
  }
  return p;
}

namespace {

bool is_cr_lf(char32_t c) {
  return c == '\r' || c == '\n';
}
// [^\r\n\p{L}\p{N}]
bool tekken_prefix(char32_t c) {
  return !is_cr_lf(c) && !is_letter(c) && !is_number(c);
}
// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
bool tekken_upper(char32_t c) {
  return is_upper(c) || is_titlecase(c) || is_modifier_letter(c) || is_other_letter(c) ||
         is_mark(c);
}
// [\p{Ll}\p{Lm}\p{Lo}\p{M}]
bool tekken_lower(char32_t c) {
  return is_lower(c) || is_modifier_letter(c) || is_other_letter(c) || is_mark(c);
}
// [^\s\p{L}\p{N}]
bool is_other(char32_t c) {
  return !is_regex_space(c) && !is_letter(c) && !is_number(c);
}

template <typename Pred>
size_t run(std::u32string_view s, size_t i, Pred p) {
  size_t j = i;
  while (j < s.size() && p(s[j])) ++j;
  return j - i;
}

// \s+(?!\S) and \s+ on a whitespace run of length w starting at i.
size_t trailing_space_match(std::u32string_view s, size_t i) {
  size_t w = run(s, i, is_regex_space);
  if (w == 0) return 0;
  if (i + w == s.size() || w == 1) return w;  // (?!\S) holds at end; else \s+ alone
  return w - 1;
}

}  // namespace

// Leftmost-first alternation of one pattern; returns the match length at i (0: no match).
size_t tekken_match(std::u32string_view s, size_t i) {
  // Alternatives 1 and 2: P? U* L+  |  P? U+ L*   (greedy, with backtracking over U*).
  for (int alt = 0; alt < 2; ++alt) {
    for (int with_p = 1; with_p >= 0; --with_p) {
      size_t p = i;
      if (with_p) {
        if (p >= s.size() || !tekken_prefix(s[p])) continue;
        ++p;
      }
      size_t u = run(s, p, tekken_upper);
      if (alt == 0) {
        for (size_t k = u + 1; k-- > 0;) {
          size_t l = run(s, p + k, tekken_lower);
          if (l > 0) return p + k + l - i;
        }
      } else if (u > 0) {
        return p + u + run(s, p + u, tekken_lower) - i;
      }
    }
  }
  if (is_number(s[i])) return 1;  // \p{N}
  {                               // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
    size_t p = i;
    if (s[p] == ' ' && p + 1 < s.size() && is_other(s[p + 1])) ++p;
    size_t q = run(s, p, is_other);
    if (q > 0) {
      p += q;
      p += run(s, p, [](char32_t c) { return is_cr_lf(c) || c == '/'; });
      return p - i;
    }
  }
  {  // \s*[\r\n]+ : the whitespace run up to its last \r or \n.
    size_t w = run(s, i, is_regex_space);
    for (size_t k = w; k-- > 0;)
      if (is_cr_lf(s[i + k])) return k + 1;
  }
  return trailing_space_match(s, i);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+  (Llama 3's pattern, shipped in Mistral Small 3.x's tokenizer.json)
size_t llama3_match(std::u32string_view s, size_t i) {
  if (s[i] == '\'' && i + 1 < s.size()) {
    // Case-insensitive as Oniguruma folds: U+017F (long s) folds to s, U+212A (Kelvin) to k.
    auto fold = [](char32_t c) -> char32_t {
      if (c == 0x17F) return 's';
      return c < 0x80 && c >= 'A' && c <= 'Z' ? c + 32 : c;
    };
    static const char32_t* kContractions[] = {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"};
    for (const char32_t* c : kContractions) {
      std::u32string_view cv(c);
      if (i + 1 + cv.size() > s.size()) continue;
      bool ok = true;
      for (size_t k = 0; k < cv.size() && ok; ++k) ok = fold(s[i + 1 + k]) == cv[k];
      if (ok) return 1 + cv.size();
    }
  }
  if (tekken_prefix(s[i]) && i + 1 < s.size() && is_letter(s[i + 1]))
    return 1 + run(s, i + 1, is_letter);
  if (is_letter(s[i])) return run(s, i, is_letter);
  if (is_number(s[i])) return std::min<size_t>(3, run(s, i, is_number));
  {
    size_t p = i;
    if (s[p] == ' ' && p + 1 < s.size() && is_other(s[p + 1])) ++p;
    size_t q = run(s, p, is_other);
    if (q > 0) return p + q + run(s, p + q, is_cr_lf) - i;
  }
  {
    size_t w = run(s, i, is_regex_space);
    for (size_t k = w; k-- > 0;)
      if (is_cr_lf(s[i + k])) return k + 1;
  }
  return trailing_space_match(s, i);
}

size_t gpt2_match(std::u32string_view s, size_t i) {
  if (s[i] == '\'' && i + 1 < s.size()) {
    static const char32_t* kContractions[] = {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"};
    for (const char32_t* c : kContractions) {
      std::u32string_view cv(c);
      if (s.substr(i + 1, cv.size()) == cv) return 1 + cv.size();
    }
  }
  size_t p = i + (s[i] == ' ' && i + 1 < s.size() ? 1 : 0);
  for (auto pred : {is_letter, is_number, is_other}) {
    size_t n = run(s, p, pred);
    if (n > 0) return p + n - i;
  }
  return trailing_space_match(s, i);
}

namespace {

std::vector<std::u32string> split_isolated(std::u32string_view text, PatternMatcher match) {
  std::vector<std::u32string> out;
  size_t gap = 0, i = 0;
  while (i < text.size()) {
    size_t n = match(text, i);
    if (n == 0) {
      ++i;
      continue;
    }
    if (i > gap) out.emplace_back(text.substr(gap, i - gap));
    out.emplace_back(text.substr(i, n));
    i += n;
    gap = i;
  }
  if (gap < text.size()) out.emplace_back(text.substr(gap));
  return out;
}

}  // namespace

std::vector<std::u32string> split_llama3(std::u32string_view text) {
  return split_isolated(text, llama3_match);
}

std::vector<std::u32string> split_tekken(std::u32string_view text) {
  return split_isolated(text, tekken_match);
}
std::vector<std::u32string> split_gpt2(std::u32string_view text) {
  return split_isolated(text, gpt2_match);
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::filesystem::path& file) {
  TokenizerJson pipeline = TokenizerJson::from_file(file);
  std::filesystem::path cfg_path = file.parent_path() / "tokenizer_config.json";
  json cfg = std::filesystem::exists(cfg_path) ? read_json_file(cfg_path) : json::object();
  // transformers adds the config's special tokens the file lacks.
  std::vector<AddedToken> specials;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (std::string t = special_token_field(cfg, key); !t.empty()) specials.push_back({t, -1});
  pipeline.add_tokens(specials);
  BpeTokenizer tok;
  if (std::string bos = special_token_field(cfg, "bos_token"); !bos.empty()) tok.bos_token_ = bos;
  std::string pad = special_token_field(cfg, "pad_token");
  if (!pad.empty()) tok.pad_id_ = pipeline.token_id(pad);
  if (cfg.value("padding_side", "right") == "left") tok.padding_side_ = Side::left;
  if (cfg.value("truncation_side", "right") == "left") tok.truncation_side_ = Side::left;
  tok.pipeline_ = std::make_shared<const TokenizerJson>(std::move(pipeline));
  return tok;
}

int64_t BpeTokenizer::token_id(const std::string& token) const {
  return pipeline_->token_id(token);
}

std::vector<int64_t> BpeTokenizer::tokenize(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> ids = pipeline_->tokenize(text);
  if (!add_special_tokens) return ids;
  const PostProcessor& post = pipeline_->post_processor();
  ids.insert(ids.begin(), post.prefix.begin(), post.prefix.end());
  ids.insert(ids.end(), post.suffix.begin(), post.suffix.end());
  return ids;
}

Encoding BpeTokenizer::encode(std::string_view text, const EncodeOptions& o) const {
  std::vector<int64_t> ids = tokenize(text, false);
  const PostProcessor& post_ = pipeline_->post_processor();
  int64_t n_special = o.add_special_tokens ? int64_t(post_.prefix.size() + post_.suffix.size()) : 0;
  int64_t cut = 0;
  if (o.truncation && o.max_length > 0)
    cut = truncate_ids(ids, o.max_length, n_special, truncation_side_);
  if (o.add_special_tokens) {
    ids.insert(ids.begin(), post_.prefix.begin(), post_.prefix.end());
    ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
  }
  bool pad = o.pad_to_max_length && o.max_length > 0 && int64_t(ids.size()) < o.max_length;
  TESSERA_CHECK(!pad || pad_id_ >= 0,
                "[bpe] padding to max_length needs a pad token, expected pad_token in "
                "tokenizer_config.json");
  Encoding e = pad_encoding(std::move(ids), o.max_length, pad_id_, padding_side_,
                            o.pad_to_max_length && o.max_length > 0);
  e.num_truncated = cut;
  return e;
}

std::string BpeTokenizer::flux2_chat_prompt(std::string_view prompt,
                                            std::string_view system_message,
                                            std::string_view bos_token) {
  // One left-to-right pass, as Python's str.replace("[IMG]", "") does.
  std::string user;
  for (size_t i = 0; i < prompt.size();) {
    if (prompt.compare(i, 5, "[IMG]") == 0) {
      i += 5;
    } else {
      user.push_back(prompt[i++]);
    }
  }
  std::string out(bos_token);
  out += "[SYSTEM_PROMPT]";
  out += system_message;
  out += "[/SYSTEM_PROMPT][INST]";
  out += user;
  out += "[/INST]";
  return out;
}

Encoding BpeTokenizer::encode_flux2_chat(std::string_view prompt, std::string_view system_message,
                                         int64_t max_length) const {
  EncodeOptions o;
  o.max_length = max_length;
  o.add_special_tokens = false;  // the template already holds bos
  return encode(flux2_chat_prompt(prompt, system_message, bos_token_), o);
}

}  // namespace tessera::tokenizers
