// Byte-level BPE as Hugging Face tokenizers runs it: the model (vocab + ranked merges), the
// GPT-2 byte <-> unicode alphabet, the hand-written split patterns, and BpeTokenizer: a
// tokenizer.json run whole (Mistral's Tekken-style tokenizer, through TokenizerJson) with the
// FLUX.2 chat prompt that Flux2Pipeline builds.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizers/encoding.h"

namespace tessera::tokenizers {

// GPT-2's reversible map from each byte to a printable code point.
const std::array<char32_t, 256>& byte_to_unicode();

class BpeModel {
 public:
  // merges: pairs of token strings in rank order. end_of_word_suffix: CLIP's "</w>".
  // fuse_unk: consecutive unknown characters become one unk.
  BpeModel(std::unordered_map<std::string, int64_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges,
           std::string end_of_word_suffix, int64_t unk_id, bool ignore_merges,
           bool fuse_unk = false);
  // Appends the ids of one pre-token given as byte-level code points.
  void encode_word(std::u32string_view word, std::vector<int64_t>& out) const;
  int64_t token_id(const std::string& token) const;  // -1 when absent
  size_t vocab_size() const { return vocab_.size(); }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges_;  // (a,b) -> (rank, merged)
  std::string suffix_;
  int64_t unk_id_;
  bool ignore_merges_;
  bool fuse_unk_;
};

// Reads vocab/merges from a parsed tokenizer.json "model" object (type BPE).
BpeModel bpe_model_from_json(const nlohmann::json& model, const std::string& file);
// Only the vocabulary and merges ("a b" strings or [a, b] lists) of such a model.
void bpe_vocab_from_json(const nlohmann::json& model, const std::string& file,
                         std::unordered_map<std::string, int64_t>& vocab,
                         std::vector<std::pair<std::string, std::string>>& merges);
// Token ids to put before and after the sequence, from tokenizer.json's "post_processor".
struct PostProcessor {
  std::vector<int64_t> prefix, suffix;
};
PostProcessor post_processor_from_json(const nlohmann::json& post, const std::string& file);
std::vector<AddedToken> added_tokens_from_json(const nlohmann::json& tokenizer_json);
// Reads a JSON file; errors name the file.
nlohmann::json read_json_file(const std::filesystem::path& path);
// A special token from tokenizer_config.json / special_tokens_map.json: a string or
// {"content": ...}; empty when absent.
std::string special_token_field(const nlohmann::json& config, const char* key);

class TokenizerJson;

class BpeTokenizer {
 public:
  // tokenizer.json (+ tokenizer_config.json beside it, for pad/bos/eos and padding_side).
  static BpeTokenizer from_tokenizer_json(const std::filesystem::path& file);

  // Tokens of `text` without padding (special tokens from the post-processor when asked).
  std::vector<int64_t> tokenize(std::string_view text, bool add_special_tokens) const;
  Encoding encode(std::string_view text, const EncodeOptions& options) const;

  // The FLUX.2 prompt: Flux2Pipeline's format_input ([IMG] removed from the prompt) rendered by
  // Mistral Small 3's chat template, tokenized without extra special tokens, truncated and
  // padded to max_length on the tokenizer's padding side.
  static std::string flux2_chat_prompt(std::string_view prompt, std::string_view system_message,
                                       std::string_view bos_token);
  Encoding encode_flux2_chat(std::string_view prompt, std::string_view system_message,
                             int64_t max_length = 512) const;

  int64_t pad_id() const { return pad_id_; }
  Side padding_side() const { return padding_side_; }
  const std::string& bos_token() const { return bos_token_; }
  int64_t token_id(const std::string& token) const;

 private:
  BpeTokenizer() = default;
  std::shared_ptr<const TokenizerJson> pipeline_;
  std::string bos_token_ = "<s>";
  int64_t pad_id_ = -1;  // none unless tokenizer_config.json names a pad_token
  Side padding_side_ = Side::right;
  Side truncation_side_ = Side::right;
};

// Pre-tokenizer regexes written out by hand (no regex engine over unicode): each *_match gives
// the length of the leftmost-first match at s[i] (0: none); split_* return the Isolated pieces.
using PatternMatcher = size_t (*)(std::u32string_view s, size_t i);
size_t tekken_match(std::u32string_view s, size_t i);
size_t llama3_match(std::u32string_view s, size_t i);
size_t gpt2_match(std::u32string_view s, size_t i);
// The Split regex of Mistral's Tekken tokenizer.json.
inline constexpr std::string_view kTekkenPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Llama 3's pattern (what the published Mistral Small 3.x tokenizer.json carries).
inline constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// GPT-2's pattern (ByteLevel with use_regex=true).
inline constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
std::vector<std::u32string> split_tekken(std::u32string_view text);
// Llama 3's pattern, which the published Mistral Small 3.x tokenizer.json carries (transformers
// keeps it unless fix_mistral_regex=True).
std::vector<std::u32string> split_llama3(std::u32string_view text);
std::vector<std::u32string> split_gpt2(std::u32string_view text);

}  // namespace tessera::tokenizers
