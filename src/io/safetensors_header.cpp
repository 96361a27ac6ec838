// Header validation for safetensors files. Kept apart from the mmap code and free of
// runtime dependencies beyond dtype.cpp, so the libFuzzer target can build it alone.
#include <algorithm>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/safetensors.h"
#include "runtime/error.h"

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr int kMaxNesting = 16;           // real headers nest 3 levels deep
constexpr uint64_t kMaxDim = 1ull << 40;  // bounds keep every size product below 2^63
constexpr uint64_t kMaxNumel = 1ull << 50;

std::string dims_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

// Rejects deep nesting before the DOM parser sees it: depth costs memory per level.
void check_nesting(const char* text, size_t len, const std::string& file) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < len; ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      TESSERA_CHECK(++depth <= kMaxNesting, file, ": header nests deeper than ", kMaxNesting,
                    " levels (expected {name: {dtype, shape, data_offsets}})");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

std::vector<SafetensorsEntry> parse_impl(const char* text, size_t len, size_t data_bytes,
                                         const std::string& file,
                                         std::map<std::string, std::string>* metadata) {
  TESSERA_CHECK(len > 0, file, ": header is empty (expected a JSON object)");
  check_nesting(text, len, file);
  std::set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty() && parsed.is_string()) {
      if (!seen.insert(parsed.get_ref<const std::string&>()).second)
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + len, on_event);
  } catch (const json::parse_error& e) {
    if (e.byte > len) TESSERA_FAIL(file, ": header is not valid JSON (it ends mid-value)");
    TESSERA_FAIL(file, ": header is not valid JSON (syntax error at byte ", e.byte, " of ", len,
                 ")");
  }
  TESSERA_CHECK(header.is_object(), file, ": header is a JSON ", header.type_name(),
                ", expected an object {name: {dtype, shape, data_offsets}}");
  TESSERA_CHECK(duplicate.empty(), file, ": tensor '", printable_name(duplicate),
                "' appears twice in the header");

  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  for (auto& [name, value] : header.items()) {
    const std::string pname = printable_name(name);
    if (name == "__metadata__") {
      TESSERA_CHECK(value.is_object(), file, ": __metadata__ is a ", value.type_name(),
                    ", expected an object of strings");
      for (auto& [k, v] : value.items()) {
        TESSERA_CHECK(v.is_string(), file, ": __metadata__ value for '", printable_name(k),
                      "' is a ", v.type_name(), ", expected a string");
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    TESSERA_CHECK(value.is_object(), file, ": tensor '", pname, "' entry is a ", value.type_name(),
                  ", expected {dtype, shape, data_offsets}");
    auto dt = value.find("dtype");
    auto sh = value.find("shape");
    auto off = value.find("data_offsets");
    TESSERA_CHECK(dt != value.end() && dt->is_string(), file, ": tensor '", pname,
                  "' has no dtype string");
    TESSERA_CHECK(sh != value.end() && sh->is_array(), file, ": tensor '", pname,
                  "' has no shape array");
    TESSERA_CHECK(off != value.end() && off->is_array() && off->size() == 2, file, ": tensor '",
                  pname, "' has no data_offsets [begin, end]");
    SafetensorsEntry e;
    e.name = name;
    const std::string& dname = dt->get_ref<const std::string&>();
    TESSERA_CHECK(dtype_from_safetensors_name(dname, &e.dtype), file, ": tensor '", pname,
                  "' has unknown dtype '", printable_name(dname, 40),
                  "' (supported: F32, BF16, F16, I64, I32, BOOL, F8_E4M3, F8_E5M2)");
    uint64_t numel = 1;
    for (auto& d : *sh) {
      TESSERA_CHECK(!d.is_number_integer() || d.is_number_unsigned(), file, ": tensor '", pname,
                    "' shape ", sh->dump(), " has a negative dimension");
      TESSERA_CHECK(d.is_number_unsigned(), file, ": tensor '", pname, "' shape ",
                    printable_name(sh->dump(), 60), " has a non-integer dimension");
      const uint64_t v = d.get<uint64_t>();
      TESSERA_CHECK(v < kMaxDim && (v == 0 || numel <= kMaxNumel / v), file, ": tensor '", pname,
                    "' shape is too large (over 2^50 elements)");
      numel *= v;
      e.shape.push_back(int64_t(v));
    }
    for (auto& o : *off)
      TESSERA_CHECK(o.is_number_unsigned(), file, ": tensor '", pname,
                    "' data_offsets are not non-negative integers");
    const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
    TESSERA_CHECK(b <= en && en <= data_bytes, file, ": tensor '", pname, "' offsets [", b, ", ",
                  en, "] are out of range (data section is ", data_bytes, " bytes)");
    const uint64_t need = numel * dtype_size(e.dtype);
    TESSERA_CHECK(en - b == need, file, ": tensor '", pname, "' shape ", dims_str(e.shape), " of ",
                  dname, " needs ", need, " bytes but offsets [", b, ", ", en, "] give ", en - b);
    e.begin = size_t(b);
    e.end = size_t(en);
    entries.push_back(std::move(e));
  }
  // Non-empty tensors must not share bytes (an empty tensor owns none, so it may sit anywhere).
  std::vector<const SafetensorsEntry*> sorted;
  for (auto& e : entries)
    if (e.end > e.begin) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return a->begin < b->begin || (a->begin == b->begin && a->end < b->end);
  });
  for (size_t i = 1; i < sorted.size(); ++i) {
    TESSERA_CHECK(sorted[i]->begin >= sorted[i - 1]->end, file, ": tensors '",
                  printable_name(sorted[i - 1]->name), "' [", sorted[i - 1]->begin, ", ",
                  sorted[i - 1]->end, "] and '", printable_name(sorted[i]->name), "' [",
                  sorted[i]->begin, ", ", sorted[i]->end, "] overlap");
  }
  return entries;
}

}  // namespace

std::string printable_name(const std::string& s, size_t max_len) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  if (out.size() >= max_len && s.size() > max_len) out += "...";
  return out;
}

std::vector<SafetensorsEntry> parse_safetensors_header(
    const char* text, size_t len, size_t data_bytes, const std::string& file,
    std::map<std::string, std::string>* metadata) {
  try {
    TESSERA_CHECK(len <= kMaxSafetensorsHeaderBytes, file, ": header length ", len, " exceeds the ",
                  kMaxSafetensorsHeaderBytes, "-byte limit");
    return parse_impl(text, len, data_bytes, file, metadata);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    TESSERA_FAIL(file, ": out of memory while parsing the ", len, "-byte header");
  } catch (const std::exception& e) {
    TESSERA_FAIL(file, ": malformed header (", printable_name(e.what()), ")");
  }
}

std::vector<SafetensorsEntry> parse_safetensors_buffer(const void* bytes, size_t size,
                                                       const std::string& file,
                                                       std::map<std::string, std::string>* metadata,
                                                       size_t* data_start) {
  TESSERA_CHECK(size > 0, file, ": empty file (a safetensors file starts with an 8-byte ",
                "header length)");
  TESSERA_CHECK(size >= 8, file, ": truncated file (", size, " bytes; a safetensors file ",
                "starts with an 8-byte header length)");
  uint8_t prefix[8];
  std::memcpy(prefix, bytes, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | prefix[i];  // little-endian
  TESSERA_CHECK(header_len <= kMaxSafetensorsHeaderBytes, file, ": header length ", header_len,
                " exceeds the ", kMaxSafetensorsHeaderBytes,
                "-byte limit (corrupt file or not safetensors)");
  TESSERA_CHECK(header_len <= size - 8, file, ": header length ", header_len,
                " runs past the end of the file (", size, " bytes; truncated?)");
  const char* header = static_cast<const char*>(bytes) + 8;
  auto entries = parse_safetensors_header(header, size_t(header_len), size - 8 - size_t(header_len),
                                          file, metadata);
  if (data_start) *data_start = 8 + size_t(header_len);
  return entries;
}

}  // namespace tessera
