#include "tokenizers/unicode.h"

#include <algorithm>
#include <vector>

namespace tessera::tokenizers {
namespace {

struct CpRange {
  uint32_t lo, hi;
};
struct LowerEntry {
  uint32_t cp;
  uint32_t out[3];
};
struct DecompEntry {
  uint32_t cp, offset, count;
};
struct CccRange {
  uint32_t lo, hi, ccc;
};
struct CompEntry {
  uint32_t a, b, c;
};

#include "tokenizers/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CpRange (&table)[N], char32_t c) {
  const CpRange* end = table + N;
  const CpRange* it = std::upper_bound(table, end, uint32_t(c),
                                       [](uint32_t v, const CpRange& r) { return v < r.lo; });
  return it != table && uint32_t(c) <= (it - 1)->hi;
}

// Hangul syllable arithmetic (Unicode chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint32_t ccc_of(char32_t c) {
  if (c < 0x300) return 0;
  const CccRange* end = kCcc + sizeof(kCcc) / sizeof(kCcc[0]);
  const CccRange* it = std::upper_bound(kCcc, end, uint32_t(c),
                                        [](uint32_t v, const CccRange& r) { return v < r.lo; });
  if (it == kCcc || uint32_t(c) > (it - 1)->hi) return 0;
  return (it - 1)->ccc;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    uint32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const DecompEntry* end = kDecomp + sizeof(kDecomp) / sizeof(kDecomp[0]);
  const DecompEntry* it = std::lower_bound(
      kDecomp, end, uint32_t(c), [](const DecompEntry& e, uint32_t v) { return e.cp < v; });
  if (it != end && it->cp == uint32_t(c)) {
    for (uint32_t i = 0; i < it->count; ++i) out.push_back(kDecompData[it->offset + i]);
  } else {
    out.push_back(c);
  }
}

// Returns the primary composite of (a, b) or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const CompEntry* end = kComp + sizeof(kComp) / sizeof(kComp[0]);
  const CompEntry* it =
      std::lower_bound(kComp, end, std::pair<uint32_t, uint32_t>(a, b),
                       [](const CompEntry& e, std::pair<uint32_t, uint32_t> v) {
                         return e.a < v.first || (e.a == v.first && e.b < v.second);
                       });
  if (it != end && it->a == uint32_t(a) && it->b == uint32_t(b)) return it->c;
  return 0;
}

}  // namespace

std::u32string utf8_to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint8_t b = uint8_t(s[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    char32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      uint8_t cb = uint8_t(s[i + k]);
      if ((cb & 0xC0) != 0x80) ok = false;
      c = (c << 6) | (cb & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if (ok && ((len == 2 && c < 0x80) || (len == 3 && c < 0x800) || (len == 4 && c < 0x10000) ||
               (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF))
      ok = false;
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(c);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string u32_to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in_ranges(kL, c);
}
bool is_upper(char32_t c) {
  return in_ranges(kLu, c);
}
bool is_lower(char32_t c) {
  return in_ranges(kLl, c);
}
bool is_titlecase(char32_t c) {
  return in_ranges(kLt, c);
}
bool is_modifier_letter(char32_t c) {
  return in_ranges(kLm, c);
}
bool is_other_letter(char32_t c) {
  return in_ranges(kLo, c);
}
bool is_mark(char32_t c) {
  return in_ranges(kM, c);
}
bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kN, c);
}
bool is_regex_space(char32_t c) {
  return in_ranges(kSpace, c);
}

bool is_rust_whitespace(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {

enum Gcb : uint32_t {
  kOther = 0,
  kCR,
  kLF,
  kControl,
  kExtend,
  kZWJ,
  kRI,
  kPrepend,
  kSpacingMark,
  kHL,
  kHV,
  kHT,
  kHLV,
  kHLVT
};

uint32_t gcb_of(char32_t c) {
  if (c >= 0x20 && c < 0x7F) return kOther;
  const CccRange* end = kGcb + sizeof(kGcb) / sizeof(kGcb[0]);
  const CccRange* it = std::upper_bound(kGcb, end, uint32_t(c),
                                        [](uint32_t v, const CccRange& r) { return v < r.lo; });
  if (it == kGcb || uint32_t(c) > (it - 1)->hi) return kOther;
  return (it - 1)->ccc;
}

}  // namespace

size_t grapheme_end(std::u32string_view s, size_t i) {
  if (i >= s.size()) return s.size();
  uint32_t prev = gcb_of(s[i]);
  size_t ri_run = prev == kRI ? 1 : 0;
  bool pict = in_ranges(kExtPict, s[i]), pict_zwj = false;  // GB11 state
  int incb = in_ranges(kInCBConsonant, s[i]) ? 1 : 0;       // GB9c: 1 consonant, 2 + linker
  size_t j = i + 1;
  for (; j < s.size(); ++j) {
    char32_t c = s[j];
    uint32_t cur = gcb_of(c);
    bool join;
    if (prev == kCR && cur == kLF)
      join = true;  // GB3
    else if (prev == kControl || prev == kCR || prev == kLF || cur == kControl || cur == kCR ||
             cur == kLF)
      join = false;  // GB4, GB5
    else if (prev == kHL && (cur == kHL || cur == kHV || cur == kHLV || cur == kHLVT))
      join = true;  // GB6
    else if ((prev == kHLV || prev == kHV) && (cur == kHV || cur == kHT))
      join = true;  // GB7
    else if ((prev == kHLVT || prev == kHT) && cur == kHT)
      join = true;  // GB8
    else if (cur == kExtend || cur == kZWJ || cur == kSpacingMark || prev == kPrepend)
      join = true;  // GB9, GB9a, GB9b
    else if (incb == 2 && in_ranges(kInCBConsonant, c))
      join = true;  // GB9c
    else if (pict_zwj && in_ranges(kExtPict, c))
      join = true;  // GB11
    else if (prev == kRI && cur == kRI && ri_run % 2 == 1)
      join = true;  // GB12, GB13
    else
      join = false;
    if (!join) break;
    ri_run = cur == kRI ? ri_run + 1 : 0;
    bool ext_pict = in_ranges(kExtPict, c);
    if (ext_pict) {
      pict = true;
      pict_zwj = false;
    } else if (cur == kZWJ && pict) {
      pict = false;
      pict_zwj = true;
    } else if (!(cur == kExtend && pict)) {
      pict = pict_zwj = false;
    }
    if (in_ranges(kInCBConsonant, c))
      incb = 1;
    else if (incb && in_ranges(kInCBLinker, c))
      incb = 2;
    else if (!(incb && in_ranges(kInCBExtend, c)))
      incb = 0;
    prev = cur;
  }
  return j;
}

std::u32string to_lower(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const LowerEntry* end = kLower + sizeof(kLower) / sizeof(kLower[0]);
  for (char32_t c : s) {
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
      continue;
    }
    const LowerEntry* it = std::lower_bound(
        kLower, end, uint32_t(c), [](const LowerEntry& e, uint32_t v) { return e.cp < v; });
    if (it != end && it->cp == uint32_t(c)) {
      for (uint32_t o : it->out)
        if (o) out.push_back(o);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::u32string nfc(std::u32string_view s) {
  // Everything below U+0300 is NFC-stable and never the second half of a composition.
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x300; }))
    return std::u32string(s);
  std::u32string d;
  d.reserve(s.size());
  for (char32_t c : s) decompose(c, d);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition: c joins the last starter unless blocked by a char in between whose
  // class is 0 or >= c's class.
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;
  uint32_t last_ccc = 0;
  for (char32_t c : d) {
    uint32_t cc = ccc_of(c);
    if (starter != std::u32string::npos) {
      bool adjacent = out.size() == starter + 1;
      if (adjacent || last_ccc < cc) {
        if (char32_t comp = compose(out[starter], c)) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = out.size();
      last_ccc = 0;
    } else {
      last_ccc = cc;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace tessera::tokenizers
