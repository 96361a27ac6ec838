// sentencepiece's precompiled charsmap (a darts-clone trie of UTF-8 keys + NUL-terminated
// replacements), applied as Hugging Face tokenizers' `Precompiled` normaliser does. Shared by the
// spiece.model path (T5Tokenizer) and tokenizer.json's "Precompiled" normaliser.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizers {

class PrecompiledCharsMap {
 public:
  // blob: the raw bytes (ModelProto.normalizer_spec.precompiled_charsmap); empty maps nothing.
  explicit PrecompiledCharsMap(std::string blob);
  // Replacement of the shortest mapped prefix of `chunk` (which then replaces all of it).
  std::optional<std::string_view> transform(std::string_view chunk) const;
  // Per extended grapheme cluster: a cluster under 6 UTF-8 bytes is looked up whole, else char
  // by char (as tokenizers does).
  std::string normalize(std::u32string_view text) const;

 private:
  std::string blob_;
  std::vector<uint32_t> units_;
  std::string_view normalized_;
};

// Standard base64 (tokenizer.json stores the charsmap so); empty optional on bad input.
std::optional<std::string> base64_decode(std::string_view text);
std::string base64_encode(std::string_view bytes);

}  // namespace tessera::tokenizers
