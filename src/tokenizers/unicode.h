// Unicode helpers for the tokenizers: UTF-8 <-> code points, the character classes the reference
// regexes use, per-character lowercasing and NFC. Tables are probed from Hugging Face
// `tokenizers` (reference/goldens/tokenizers.py --unicode-tables), so they match it exactly.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::tokenizers {

// Invalid UTF-8 bytes decode to U+FFFD, as Python's errors="replace" does.
std::u32string utf8_to_u32(std::string_view s);
std::string u32_to_utf8(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);

// Regex classes as the reference's regex engine (Oniguruma) defines them.
bool is_letter(char32_t c);           // \p{L}
bool is_upper(char32_t c);            // \p{Lu}
bool is_lower(char32_t c);            // \p{Ll}
bool is_titlecase(char32_t c);        // \p{Lt}
bool is_modifier_letter(char32_t c);  // \p{Lm}
bool is_other_letter(char32_t c);     // \p{Lo}
bool is_mark(char32_t c);             // \p{M}
bool is_number(char32_t c);           // \p{N}
bool is_regex_space(char32_t c);      // \s
// Rust's char::is_whitespace (WhitespaceSplit, added-token lstrip/rstrip).
bool is_rust_whitespace(char32_t c);

// End (exclusive) of the extended grapheme cluster (UAX #29, with GB9c and GB11) at s[i].
size_t grapheme_end(std::u32string_view s, size_t i);

// Per-character full lowercase mapping (no context rules: final sigma stays sigma).
std::u32string to_lower(std::u32string_view s);
// Canonical composition (NFC).
std::u32string nfc(std::u32string_view s);

}  // namespace tessera::tokenizers
