// What transformers 5 takes from a tokenizer folder's config files for its added and special
// tokens (PreTrainedTokenizerBase._from_pretrained and TokenizersBackend.__init__).
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "tokenizers/encoding.h"

namespace tessera::tokenizers {

// tokenizer_config.json, with special_tokens_map.json's entries over it when the config has no
// "added_tokens_decoder" (its objects then count as special); {} when neither file exists.
nlohmann::json load_tokenizer_config(const std::filesystem::path& dir);

// Added tokens of "added_tokens_decoder" ({id: {content, flags}}) in id order; empty when absent.
// transformers takes these instead of tokenizer.json's "added_tokens".
std::vector<AddedToken> added_tokens_from_config(const nlohmann::json& config);

// The named special tokens (and extra special tokens), in transformers' order, as it adds them:
// each value is a string or an AddedToken object; a value equal to an earlier one (same string,
// or same object fields) is skipped, and for one content the last value sets the flags. Ids are
// left at -1 for TokenizerJson::add_tokens, which keeps contents already added.
std::vector<AddedToken> special_tokens_to_add(const std::vector<nlohmann::json>& values);

// config[key] as given (string or object), else `fallback` as a string.
nlohmann::json special_token_value(const nlohmann::json& config, const char* key,
                                   const char* fallback);

}  // namespace tessera::tokenizers
