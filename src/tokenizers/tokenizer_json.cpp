#include "tokenizers/tokenizer_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tokenizers/charsmap.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {

using nlohmann::json;

namespace {

// ---- normalisers -----------------------------------------------------------------------------

struct NormStep {
  enum Kind { nfc, lowercase, replace, strip, prepend, precompiled } kind = nfc;
  enum class Rx { none, spaces, multi_space } rx = Rx::none;  // Replace: \s+ or " {2,}"
  std::u32string pattern, content;
  bool left = false, right = false;
  std::shared_ptr<const PrecompiledCharsMap> charsmap;
};

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

void parse_normalizer(const json& n, const std::string& file, std::vector<NormStep>& out) {
  if (n.is_null()) return;
  const std::string type = type_of(n);
  NormStep st;
  if (type == "Sequence") {
    for (const json& sub : n.at("normalizers")) parse_normalizer(sub, file, out);
    return;
  } else if (type == "NFC") {
    st.kind = NormStep::nfc;
  } else if (type == "Lowercase") {
    st.kind = NormStep::lowercase;
  } else if (type == "Replace") {
    st.kind = NormStep::replace;
    const json& p = n.at("pattern");
    st.content = utf8_to_u32(n.at("content").get<std::string>());
    if (p.contains("String")) {
      st.pattern = utf8_to_u32(p["String"].get<std::string>());
      TESSERA_CHECK(!st.pattern.empty(), "[tokenizer] ", file,
                    ": Replace normalizer with an empty pattern, expected a non-empty string");
    } else {
      std::string rx = p.value("Regex", "");
      if (rx == "\\s+")
        st.rx = NormStep::Rx::spaces;
      else if (rx == " {2,}")
        st.rx = NormStep::Rx::multi_space;
      else
        TESSERA_FAIL("[tokenizer] ", file, ": Replace normalizer regex '", rx,
                     "' is not supported, expected \\s+ or ' {2,}' or a String pattern");
    }
  } else if (type == "Strip") {
    st.kind = NormStep::strip;
    st.left = n.value("strip_left", n.value("left", false));
    st.right = n.value("strip_right", n.value("right", false));
  } else if (type == "Prepend") {
    st.kind = NormStep::prepend;
    st.content = utf8_to_u32(n.at("prepend").get<std::string>());
  } else if (type == "Precompiled") {
    st.kind = NormStep::precompiled;
    st.charsmap = std::make_shared<PrecompiledCharsMap>(precompiled_charsmap_from_json(n, file));
  } else {
    TESSERA_FAIL("[tokenizer] ", file, ": normalizer '", type,
                 "' is not supported, expected Sequence, NFC, Lowercase, Replace, Strip, Prepend "
                 "or Precompiled");
  }
  out.push_back(std::move(st));
}

std::u32string apply(const NormStep& st, std::u32string s) {
  switch (st.kind) {
    case NormStep::nfc:
      return nfc(s);
    case NormStep::lowercase:
      return to_lower(s);
    case NormStep::prepend:
      return s.empty() ? s : st.content + s;
    case NormStep::precompiled:
      return utf8_to_u32(st.charsmap->normalize(s));
    case NormStep::strip: {
      size_t b = 0, e = s.size();
      if (st.left)
        while (b < e && is_rust_whitespace(s[b])) ++b;
      if (st.right)
        while (e > b && is_rust_whitespace(s[e - 1])) --e;
      return s.substr(b, e - b);
    }
    case NormStep::replace: {
      std::u32string out;
      for (size_t i = 0; i < s.size();) {
        size_t n = 0;
        if (st.rx == NormStep::Rx::spaces) {
          while (i + n < s.size() && is_regex_space(s[i + n])) ++n;
        } else if (st.rx == NormStep::Rx::multi_space) {
          while (i + n < s.size() && s[i + n] == U' ') ++n;
          if (n < 2) n = 0;
        } else if (s.compare(i, st.pattern.size(), st.pattern) == 0) {
          n = st.pattern.size();
        }
        if (n == 0) {
          out.push_back(s[i++]);
        } else {
          out += st.content;
          i += n;
        }
      }
      return out;
    }
  }
  return s;
}

// ---- pre-tokenisers --------------------------------------------------------------------------

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreStep {
  enum Kind { split, byte_level, metaspace, whitespace_split, digits } kind = split;
  PatternMatcher matcher = nullptr;  // Split: a known regex, else `literal`
  std::u32string literal;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  bool use_regex = false;  // ByteLevel
  char32_t replacement = U'\u2581';
  bool prepend = true, split_pieces = true;  // Metaspace
  bool individual_digits = false;
};

Behavior behavior_of(const json& p, const std::string& file) {
  std::string b = p.value("behavior", "");
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  TESSERA_FAIL("[tokenizer] ", file, ": Split behavior '", b, "' is not supported");
}

PatternMatcher known_split_pattern(std::string_view rx) {
  if (rx == kTekkenPattern) return tekken_match;
  if (rx == kLlama3Pattern) return llama3_match;
  if (rx == kGpt2Pattern) return gpt2_match;
  if (rx == kClipPattern) return clip_match;
  return nullptr;
}

void parse_pre_tokenizer(const json& p, const std::string& file, std::vector<PreStep>& out) {
  if (p.is_null()) return;
  const std::string type = type_of(p);
  PreStep st;
  if (type == "Sequence") {
    for (const json& sub : p.at("pretokenizers")) parse_pre_tokenizer(sub, file, out);
    return;
  } else if (type == "Split") {
    const json& pat = p.at("pattern");
    if (pat.contains("String")) {
      st.literal = utf8_to_u32(pat["String"].get<std::string>());
      TESSERA_CHECK(!st.literal.empty(), "[tokenizer] ", file,
                    ": Split pre-tokenizer with an empty pattern, expected a non-empty string");
    } else {
      std::string rx = pat.value("Regex", "");
      st.matcher = known_split_pattern(rx);
      TESSERA_CHECK(st.matcher, "[tokenizer] ", file, ": Split pre-tokenizer with pattern '", rx,
                    "' is not supported, expected Mistral's Tekken, Llama 3's, GPT-2's or CLIP's "
                    "pattern (regexes are written out by hand)");
    }
    st.behavior = behavior_of(p, file);
    st.invert = p.value("invert", false);
  } else if (type == "ByteLevel") {
    st.kind = PreStep::byte_level;
    TESSERA_CHECK(!p.value("add_prefix_space", false), "[tokenizer] ", file,
                  ": ByteLevel pre-tokenizer with add_prefix_space=true is not supported");
    st.use_regex = p.value("use_regex", true);
  } else if (type == "Metaspace") {
    st.kind = PreStep::metaspace;
    std::u32string r = utf8_to_u32(p.value("replacement", "\u2581"));
    TESSERA_CHECK(r.size() == 1, "[tokenizer] ", file,
                  ": Metaspace replacement must be one character");
    st.replacement = r[0];
    // Older files carry add_prefix_space instead of prepend_scheme.
    std::string scheme =
        p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
    TESSERA_CHECK(scheme == "always" || scheme == "never", "[tokenizer] ", file,
                  ": Metaspace prepend_scheme '", scheme,
                  "' is not supported, expected 'always' or 'never'");
    st.prepend = scheme == "always";
    st.split_pieces = p.value("split", true);
  } else if (type == "WhitespaceSplit") {
    st.kind = PreStep::whitespace_split;
  } else if (type == "Digits") {
    st.kind = PreStep::digits;
    st.individual_digits = p.value("individual_digits", false);
  } else {
    TESSERA_FAIL("[tokenizer] ", file, ": pre-tokenizer '", type,
                 "' is not supported, expected Sequence, Split, ByteLevel, Metaspace, "
                 "WhitespaceSplit or Digits");
  }
  out.push_back(std::move(st));
}

struct Match {
  size_t begin, end;
  bool is_match;
};

// tokenizers' Pattern::find_matches: matches and the gaps between them, in order.
template <typename At>
std::vector<Match> find_matches(std::u32string_view s, At match_at) {
  std::vector<Match> out;
  size_t gap = 0;
  for (size_t i = 0; i < s.size();) {
    size_t n = match_at(s, i);
    if (n == 0) {
      ++i;
      continue;
    }
    if (i > gap) out.push_back({gap, i, false});
    out.push_back({i, i + n, true});
    i += n;
    gap = i;
  }
  if (gap < s.size()) out.push_back({gap, s.size(), false});
  return out;
}

// NormalizedString::split: how matches and gaps become pieces (empty pieces dropped).
void split_by(std::u32string_view s, std::vector<Match> m, Behavior b, bool invert,
              std::vector<std::u32string>& out) {
  if (invert)
    for (Match& x : m) x.is_match = !x.is_match;
  std::vector<Match> kept;  // is_match here means "remove"
  switch (b) {
    case Behavior::removed:
      kept = m;
      break;
    case Behavior::isolated:
      for (Match x : m) kept.push_back({x.begin, x.end, false});
      break;
    case Behavior::contiguous: {
      bool prev = false;
      for (const Match& x : m) {
        if (x.is_match == prev && !kept.empty())
          kept.back().end = x.end;
        else
          kept.push_back({x.begin, x.end, false});
        prev = x.is_match;
      }
      break;
    }
    case Behavior::merged_with_previous: {
      bool prev = false;
      for (const Match& x : m) {
        if (x.is_match && !prev && !kept.empty())
          kept.back().end = x.end;
        else
          kept.push_back({x.begin, x.end, false});
        prev = x.is_match;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool prev = false;
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->is_match && !prev && !kept.empty())
          kept.back().begin = it->begin;
        else
          kept.push_back({it->begin, it->end, false});
        prev = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const Match& x : kept)
    if (!x.is_match && x.end > x.begin) out.emplace_back(s.substr(x.begin, x.end - x.begin));
}

template <typename Pred>
auto each_char(Pred pred) {
  return [pred](std::u32string_view s, size_t i) -> size_t { return pred(s[i]) ? 1 : 0; };
}

void apply(const PreStep& st, std::vector<std::u32string>& pieces) {
  std::vector<std::u32string> out;
  for (std::u32string& piece : pieces) {
    switch (st.kind) {
      case PreStep::split:
        if (st.matcher) {
          split_by(piece, find_matches(piece, st.matcher), st.behavior, st.invert, out);
        } else {
          auto lit = [&](std::u32string_view s, size_t i) -> size_t {
            return s.compare(i, st.literal.size(), st.literal) == 0 ? st.literal.size() : 0;
          };
          split_by(piece, find_matches(piece, lit), st.behavior, st.invert, out);
        }
        break;
      case PreStep::whitespace_split:
        split_by(piece, find_matches(piece, each_char(is_rust_whitespace)), Behavior::removed,
                 false, out);
        break;
      case PreStep::digits:
        split_by(piece, find_matches(piece, each_char(is_number)),
                 st.individual_digits ? Behavior::isolated : Behavior::contiguous, false, out);
        break;
      case PreStep::metaspace: {
        for (char32_t& c : piece)
          if (c == U' ') c = st.replacement;
        // As NormalizedString::prepend: nothing is prepended to an empty piece.
        if (st.prepend && !piece.empty() && piece[0] != st.replacement)
          piece.insert(piece.begin(), st.replacement);
        if (!st.split_pieces) {
          out.push_back(std::move(piece));
        } else {
          char32_t r = st.replacement;
          split_by(piece, find_matches(piece, each_char([r](char32_t c) { return c == r; })),
                   Behavior::merged_with_next, false, out);
        }
        break;
      }
      case PreStep::byte_level: {
        std::vector<std::u32string> sub;
        if (st.use_regex)
          sub = split_gpt2(piece);
        else
          sub.push_back(std::move(piece));
        for (const std::u32string& x : sub) {
          std::string bytes = u32_to_utf8(x);
          std::u32string mapped;
          mapped.reserve(bytes.size());
          for (unsigned char b : bytes) mapped.push_back(byte_to_unicode()[b]);
          if (!mapped.empty()) out.push_back(std::move(mapped));
        }
        break;
      }
    }
  }
  pieces = std::move(out);
}

}  // namespace

struct TokenizerJson::Steps {
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
};

// ---- model parts -----------------------------------------------------------------------------

std::vector<std::pair<std::string, double>> unigram_vocab_from_json(const json& model,
                                                                    const std::string& file) {
  TESSERA_CHECK(model.contains("vocab") && model["vocab"].is_array(), "[unigram] ", file,
                ": model.vocab missing, expected a list of [piece, score]");
  std::vector<std::pair<std::string, double>> vocab;
  vocab.reserve(model["vocab"].size());
  for (const json& e : model["vocab"]) {
    TESSERA_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
                  "[unigram] ", file, ": a vocab entry is not [piece, score]");
    vocab.emplace_back(e[0].get<std::string>(), e[1].get<double>());
  }
  return vocab;
}

std::string precompiled_charsmap_from_json(const json& n, const std::string& file) {
  if (!n.is_object()) return "";
  if (type_of(n) == "Sequence") {
    for (const json& sub : n.at("normalizers"))
      if (std::string m = precompiled_charsmap_from_json(sub, file); !m.empty()) return m;
    return "";
  }
  if (type_of(n) != "Precompiled" || !n.contains("precompiled_charsmap") ||
      !n["precompiled_charsmap"].is_string())
    return "";
  std::optional<std::string> blob = base64_decode(n["precompiled_charsmap"].get<std::string>());
  TESSERA_CHECK(blob, "[tokenizer] ", file, ": precompiled_charsmap is not valid base64");
  return *blob;
}

TokenizerModel tokenizer_model_from_json(const json& model, const std::string& file) {
  const std::string type = type_of(model);
  if (type == "BPE" || (type.empty() && model.contains("merges")))
    return bpe_model_from_json(model, file);
  if (type == "Unigram") {
    TESSERA_CHECK(!model.value("byte_fallback", false), "[unigram] ", file,
                  ": Unigram with byte_fallback=true is not supported");
    int64_t unk = model.contains("unk_id") && model["unk_id"].is_number_integer()
                      ? model["unk_id"].get<int64_t>()
                      : -1;
    return UnigramModel(unigram_vocab_from_json(model, file), unk);
  }
  TESSERA_FAIL("[tokenizer] ", file, ": model type '", type,
               "' is not supported, expected BPE or Unigram");
}

// ---- TokenizerJson ---------------------------------------------------------------------------

TokenizerJson::TokenizerJson(TokenizerModel model)
    : model_(std::move(model)), steps_(std::make_unique<Steps>()) {}
TokenizerJson::TokenizerJson(TokenizerJson&&) noexcept = default;
TokenizerJson& TokenizerJson::operator=(TokenizerJson&&) noexcept = default;
TokenizerJson::~TokenizerJson() = default;

TokenizerJson TokenizerJson::from_file(const std::filesystem::path& file) {
  return from_json(read_json_file(file), file.string());
}

TokenizerJson TokenizerJson::from_json(const json& tj, const std::string& file) {
  TESSERA_CHECK(tj.is_object() && tj.contains("model"), "[tokenizer] ", file,
                " has no \"model\", expected a tokenizer.json");
  // Truncation and padding stored in the file are ignored: transformers overrides them on every
  // call that names truncation/padding, and disables them on calls that do not.
  return from_parts(tj.value("normalizer", json()), tj.value("pre_tokenizer", json()),
                    tokenizer_model_from_json(tj["model"], file), added_tokens_from_json(tj),
                    post_processor_from_json(tj.value("post_processor", json()), file), file);
}

TokenizerJson TokenizerJson::from_parts(const json& normalizer, const json& pre_tokenizer,
                                        TokenizerModel model, std::vector<AddedToken> added,
                                        PostProcessor post, const std::string& file) {
  TokenizerJson t(std::move(model));
  parse_normalizer(normalizer, file, t.steps_->norm);
  parse_pre_tokenizer(pre_tokenizer, file, t.steps_->pre);
  t.post_ = std::move(post);
  t.set_added(std::move(added));
  return t;
}

void TokenizerJson::set_added(std::vector<AddedToken> added) {
  added_ = std::move(added);
  raw_added_.clear();
  norm_added_.clear();
  for (const AddedToken& a : added_) {
    if (!a.normalized) {
      raw_added_.push_back(a);
      continue;
    }
    // Matched in normalised text against its own normalised form, as AddedVocabulary does.
    AddedToken n = a;
    std::u32string c = utf8_to_u32(a.content);
    for (const NormStep& st : steps_->norm) c = apply(st, std::move(c));
    n.content = u32_to_utf8(c);
    n.normalized = false;
    norm_added_.push_back(std::move(n));
  }
}

void TokenizerJson::add_tokens(const std::vector<AddedToken>& tokens) {
  std::vector<AddedToken> all = added_;
  int64_t vocab = std::visit([](const auto& m) { return int64_t(m.vocab_size()); }, model_);
  for (AddedToken t : tokens) {
    if (t.content.empty()) continue;
    bool present = false;
    for (const AddedToken& a : all) present |= a.content == t.content;
    if (present) continue;
    if (t.id < 0) {
      t.id = std::visit([&](const auto& m) { return m.token_id(t.content); }, model_);
      if (t.id < 0) {  // the next id after the vocabulary and the added tokens
        t.id = vocab;
        for (const AddedToken& a : all) t.id = std::max(t.id, a.id + 1);
      }
    }
    all.push_back(std::move(t));
  }
  set_added(std::move(all));
}

int64_t TokenizerJson::token_id(const std::string& token) const {
  for (const AddedToken& t : added_)
    if (t.content == token) return t.id;
  return std::visit([&](const auto& m) { return m.token_id(token); }, model_);
}

void TokenizerJson::run_model(std::u32string_view piece, std::vector<int64_t>& out) const {
  if (const auto* bpe = std::get_if<BpeModel>(&model_))
    bpe->encode_word(piece, out);
  else
    std::get<UnigramModel>(model_).encode(u32_to_utf8(piece), out);
}

void TokenizerJson::tokenize_normalized(std::u32string text, std::vector<int64_t>& out) const {
  std::vector<std::u32string> pieces;
  pieces.push_back(std::move(text));
  for (const PreStep& st : steps_->pre) apply(st, pieces);
  for (const std::u32string& p : pieces) run_model(p, out);
}

std::vector<int64_t> TokenizerJson::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const Segment& seg : split_added_tokens(text, raw_added_)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::u32string u = utf8_to_u32(seg.text);
    for (const NormStep& st : steps_->norm) u = apply(st, std::move(u));
    if (norm_added_.empty()) {
      tokenize_normalized(std::move(u), ids);
      continue;
    }
    for (const Segment& sub : split_added_tokens(u32_to_utf8(u), norm_added_)) {
      if (sub.id >= 0)
        ids.push_back(sub.id);
      else
        tokenize_normalized(utf8_to_u32(sub.text), ids);
    }
  }
  return ids;
}

}  // namespace tessera::tokenizers
