// CLIPTokenizer as transformers 5 runs it (the class diffusers loads for FLUX.1 and SD3):
// NFC, whitespace runs -> " ", lowercase; CLIP's split pattern, then ByteLevel (GPT-2 split and
// the byte alphabet); BPE with "</w>"; <|startoftext|> ... <|endoftext|>; truncation and padding
// to model_max_length (77).
#pragma once
#include <filesystem>
#include <memory>
#include <string_view>

#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/encoding.h"

namespace tessera::tokenizers {

class TokenizerJson;

class ClipTokenizer {
 public:
  // A CLIPTokenizer folder, read in transformers' order: tokenizer.json (vocabulary, merges and
  // added tokens; the class builds the rest of the pipeline itself), else vocab.json +
  // merges.txt; plus tokenizer_config.json and/or special_tokens_map.json (bos/eos/unk/pad;
  // FLUX.1 pads with <|endoftext|>, SD3's tokenizer_2 with "!").
  static ClipTokenizer from_folder(const std::filesystem::path& dir);

  // padding="max_length", truncation=True, max_length=model_max_length by default.
  Encoding encode(std::string_view text, EncodeOptions options = {}) const;
  // BPE ids of the text, without bos/eos.
  std::vector<int64_t> tokenize(std::string_view text) const;

  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t model_max_length() const { return max_length_; }

 private:
  ClipTokenizer() = default;
  std::shared_ptr<const TokenizerJson> pipeline_;
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, max_length_ = 77;
};

// CLIP's split regex as the class writes it, and its hand-written matcher: the length of the
// match at s[i] (0: none; whitespace never matches and is removed).
inline constexpr std::string_view kClipPattern =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|"
    "[^\\s\\p{L}\\p{N}]+";
size_t clip_match(std::u32string_view s, size_t i);

}  // namespace tessera::tokenizers
