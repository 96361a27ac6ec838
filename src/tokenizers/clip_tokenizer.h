// CLIPTokenizer as transformers 5 runs it (the class diffusers loads for FLUX.1 and SD3):
// NFC, whitespace runs -> " ", lowercase; CLIP's split pattern; byte-level BPE with "</w>";
// <|startoftext|> ... <|endoftext|>; truncation and padding to model_max_length (77).
#pragma once
#include <filesystem>
#include <string_view>

#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/encoding.h"

namespace tessera::tokenizers {

class ClipTokenizer {
 public:
  // A CLIPTokenizer folder: vocab.json, merges.txt, tokenizer_config.json and/or
  // special_tokens_map.json (bos/eos/unk/pad; FLUX.1 pads with <|endoftext|>, SD3's
  // tokenizer_2 with "!").
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
  explicit ClipTokenizer(BpeModel model) : model_(std::move(model)) {}
  BpeModel model_;
  std::vector<AddedToken> added_;
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, max_length_ = 77;
};

// CLIP's normaliser and pre-tokeniser (exposed for tests).
std::u32string clip_normalize(std::u32string_view text);
std::vector<std::u32string> clip_split(std::u32string_view normalized);

}  // namespace tessera::tokenizers
