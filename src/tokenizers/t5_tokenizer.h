// The T5 tokenizer as transformers 5 runs it for FLUX.1 / SD3 (T5TokenizerFast): added tokens
// (<pad>, </s>, <unk>, <extra_id_N>) split from the raw text; the rest normalised with the
// model's charsmap per grapheme cluster (transformers' Precompiled), split on whitespace, each
// word encoded by the sentencepiece unigram model (spiece.model, normaliser switched off);
// then </s>, truncation and padding to max_sequence_length.
#pragma once
#include <filesystem>
#include <memory>
#include <string_view>

#include "tokenizers/encoding.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tessera::tokenizers {

class T5Tokenizer {
 public:
  // Folder with spiece.model; tokenizer.json (added tokens) and tokenizer_config.json are read
  // when present, otherwise T5's defaults apply (100 extra ids after the sentencepiece vocab).
  static T5Tokenizer from_folder(const std::filesystem::path& dir);
  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;

  // padding="max_length", truncation=True, add_special_tokens=True as the pipelines call it.
  Encoding encode(std::string_view text, int64_t max_length) const;
  Encoding encode(std::string_view text, const EncodeOptions& options) const;
  std::vector<int64_t> tokenize(std::string_view text) const;  // no </s>

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t vocab_size() const;

 private:
  T5Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<AddedToken> added_;
  class CharsMap;
  std::unique_ptr<CharsMap> charsmap_;
  int64_t eos_id_ = 1, pad_id_ = 0;
};

}  // namespace tessera::tokenizers
