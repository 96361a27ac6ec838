// The T5 tokenizer as transformers 5 runs it for FLUX.1 / SD3 (T5Tokenizer, a.k.a.
// T5TokenizerFast): added tokens (<pad>, </s>, <unk>, <extra_id_N>) split from the raw text; the
// rest normalised with the model's charsmap per grapheme cluster (Precompiled), split on
// whitespace, "▁" prepended (Metaspace), each piece through tokenizers' Unigram model; then
// </s>, truncation and padding to max_sequence_length.
#pragma once
#include <filesystem>
#include <memory>
#include <string_view>

#include "tokenizers/encoding.h"

namespace tessera::tokenizers {

class TokenizerJson;

class T5Tokenizer {
 public:
  // A T5 tokenizer folder, read in transformers' order: tokenizer.json (the Unigram vocabulary,
  // charsmap and added tokens; the class builds the rest of the pipeline itself), else
  // spiece.model (its pieces and charsmap, then T5's 100 extra ids); tokenizer_config.json when
  // present (eos/pad/unk, extra ids, added_tokens_decoder).
  static T5Tokenizer from_folder(const std::filesystem::path& dir);

  // padding="max_length", truncation=True, add_special_tokens=True as the pipelines call it.
  Encoding encode(std::string_view text, int64_t max_length) const;
  Encoding encode(std::string_view text, const EncodeOptions& options) const;
  std::vector<int64_t> tokenize(std::string_view text) const;  // no </s>

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t vocab_size() const { return vocab_size_; }  // Unigram pieces, extra ids included

 private:
  T5Tokenizer() = default;
  std::shared_ptr<const TokenizerJson> pipeline_;
  int64_t eos_id_ = 1, pad_id_ = 0, vocab_size_ = 0;
};

}  // namespace tessera::tokenizers
