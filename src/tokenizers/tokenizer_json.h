// A Hugging Face `tokenizers` pipeline read from tokenizer.json: added tokens, normaliser,
// pre-tokeniser, model (BPE or Unigram) and post-processor, run as `tokenizers` runs them.
// Only the components that CLIP, T5 and Mistral tokenizers use are implemented; any other is
// refused at load with an error naming the component and the file.
//
// transformers 5 runs a tokenizer.json whole only for its generic class (PreTrainedTokenizerFast,
// as FLUX.2's Mistral tokenizer); CLIPTokenizer and T5Tokenizer take the vocabulary (and T5's
// charsmap) from the file and build their own pipeline. Those loaders therefore assemble a
// pipeline from parts (`from_parts`) with the class's components; see clip/t5_tokenizer.cpp.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/encoding.h"
#include "tokenizers/unigram_model.h"

namespace tessera::tokenizers {

using TokenizerModel = std::variant<BpeModel, UnigramModel>;

// The model of a tokenizer.json ("model": BPE or Unigram) as the file describes it.
TokenizerModel tokenizer_model_from_json(const nlohmann::json& model, const std::string& file);
// Unigram (piece, score) list of a tokenizer.json model.
std::vector<std::pair<std::string, double>> unigram_vocab_from_json(const nlohmann::json& model,
                                                                    const std::string& file);
// The decoded Precompiled charsmap of a tokenizer.json normaliser (alone or in a Sequence);
// empty when there is none.
std::string precompiled_charsmap_from_json(const nlohmann::json& normalizer,
                                           const std::string& file);

class TokenizerJson {
 public:
  // The whole file, as tokenizers' Tokenizer.from_file runs it.
  static TokenizerJson from_file(const std::filesystem::path& file);
  static TokenizerJson from_json(const nlohmann::json& tokenizer_json, const std::string& file);
  // normalizer / pre_tokenizer: tokenizer.json objects (or null); file names errors.
  static TokenizerJson from_parts(const nlohmann::json& normalizer,
                                  const nlohmann::json& pre_tokenizer, TokenizerModel model,
                                  std::vector<AddedToken> added, PostProcessor post,
                                  const std::string& file);
  TokenizerJson(TokenizerJson&&) noexcept;
  TokenizerJson& operator=(TokenizerJson&&) noexcept;
  ~TokenizerJson();

  // Ids of `text` without the post-processor's tokens.
  std::vector<int64_t> tokenize(std::string_view text) const;
  const PostProcessor& post_processor() const { return post_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // Added tokens first, then the model's vocabulary; -1 when absent.
  int64_t token_id(const std::string& token) const;
  // Adds tokens as transformers' add_tokens does: a content already added is kept as it is;
  // id < 0 takes the model's id, or the next free id after the vocabulary.
  void add_tokens(const std::vector<AddedToken>& tokens);

 private:
  struct Steps;
  explicit TokenizerJson(TokenizerModel model);
  void set_added(std::vector<AddedToken> added);
  void run_model(std::u32string_view piece, std::vector<int64_t>& out) const;
  void tokenize_normalized(std::u32string normalized, std::vector<int64_t>& out) const;

  TokenizerModel model_;
  std::unique_ptr<Steps> steps_;
  std::vector<AddedToken> added_;       // as given (normalized flag per token)
  std::vector<AddedToken> raw_added_;   // normalized == false: matched on the raw text
  std::vector<AddedToken> norm_added_;  // normalized == true, content normalised, flag cleared
  PostProcessor post_;
};

}  // namespace tessera::tokenizers
