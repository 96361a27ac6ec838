// What every tokenizer returns, and the pieces they share: added (special) tokens split out of
// the raw text before normalisation, and transformers' truncation and padding.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace tessera::tokenizers {

struct Encoding {
  std::vector<int64_t> ids;
  std::vector<int64_t> attention_mask;  // 1 for tokens, 0 for padding
  int64_t num_truncated = 0;  // tokens cut by truncation (pipelines warn as diffusers does)
};

enum class Side { left, right };

// Options as transformers' tokenizer __call__ takes them (padding="max_length" when pad).
struct EncodeOptions {
  int64_t max_length = 0;  // 0: no truncation and no padding
  bool truncation = true;
  bool pad_to_max_length = true;
  bool add_special_tokens = true;
};

// An entry of tokenizer.json's "added_tokens" (flags as Hugging Face tokenizers defines them).
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false, special = true;
};

// A piece of input: either plain text to tokenize, or an added token already resolved.
struct Segment {
  std::string text;
  int64_t id = -1;  // >= 0 for an added token
};

// Splits raw text on the added tokens, leftmost-longest as tokenizers' AddedVocabulary does
// (only tokens with normalized == false; lstrip/rstrip swallow adjacent whitespace).
std::vector<Segment> split_added_tokens(std::string_view text,
                                        const std::vector<AddedToken>& tokens);

// Cuts `ids` so that ids + n_special fit in max_length (truncation side `side`); returns how
// many were cut.
int64_t truncate_ids(std::vector<int64_t>& ids, int64_t max_length, int64_t n_special, Side side);
// Builds the mask and pads ids/mask to max_length with pad_id on `side`.
Encoding pad_encoding(std::vector<int64_t> ids, int64_t max_length, int64_t pad_id, Side side,
                      bool pad);

// Stacks equal-length encodings into (B, L) int64 input_ids and attention_mask tensors.
std::pair<Tensor, Tensor> to_tensors(const std::vector<Encoding>& batch);

}  // namespace tessera::tokenizers
