#include "backends/xla/executable_cache.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/atomic_file.h"

namespace tessera::xla {
namespace {

constexpr const char* kMagic = "tessera-xla-executable 1";

// 64-bit FNV-1a over 8-byte words (payloads reach tens of MB), seeded so that the file name's
// key and the header's module hash are independent.
uint64_t digest(const std::string& s, uint64_t seed) {
  uint64_t h = 14695981039346656037ull ^ seed;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  for (; i < s.size(); ++i) h = (h ^ uint8_t(s[i])) * 1099511628211ull;
  return (h ^ s.size()) * 1099511628211ull;
}

std::string hex_bytes(const std::string& s) {
  std::string out;
  char buf[3];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

// Everything before the payload: the key spelled out, then the payload's size and checksum.
std::string header(const std::string& identity, const std::string& options,
                   const std::string& module, const std::string& payload) {
  return std::string(kMagic) + "\nidentity " + identity + "\noptions " + hex_bytes(options) +
         "\nmodule " + hex64(digest(module, 1)) + " " + std::to_string(module.size()) +
         "\npayload " + std::to_string(payload.size()) + " " + hex64(digest(payload, 2)) + "\n";
}

}  // namespace

std::string executable_cache_path(const std::string& dir, const std::string& identity,
                                  const std::string& options, const std::string& module) {
  const uint64_t key = digest(identity + '\0' + options + '\0' + module, 0);
  return (std::filesystem::path(dir) / "xla" / (hex64(key) + ".pjrt")).string();
}

bool load_cached_executable(const std::string& path, const std::string& identity,
                            const std::string& options, const std::string& module,
                            std::string* payload) {
  std::string text;
  if (!read_whole_file(path, &text)) return false;
  auto warn = [&](const char* why) {
    std::fprintf(stderr, "[xla] ignoring the cached executable %s: %s; compiling again\n",
                 path.c_str(), why);
    return false;
  };
  // The header ends at the line "payload <size> <checksum>".
  const size_t p = text.find("\npayload ");
  if (text.compare(0, std::strlen(kMagic), kMagic) != 0 || p == std::string::npos)
    return warn("not a tessera executable file (or truncated)");
  const size_t end = text.find('\n', p + 1);
  if (end == std::string::npos) return warn("truncated header");
  unsigned long long size = 0;
  char sum[17] = {};
  if (std::sscanf(text.c_str() + p + 1, "payload %llu %16s", &size, sum) != 2)
    return warn("malformed header");
  const std::string body = text.substr(end + 1);
  if (body.size() != size) return warn("truncated payload");
  if (text.substr(0, end + 1) != header(identity, options, module, body))
    return warn(hex64(digest(body, 2)) != sum ? "checksum mismatch (corrupt)"
                                            : "written for another plugin, options or module");
  *payload = body;
  return true;
}

void store_cached_executable(const std::string& path, const std::string& identity,
                             const std::string& options, const std::string& module,
                             const std::string& payload) {
  const std::string head = header(identity, options, module, payload);
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomically(path, [&](std::FILE* f) {
      return std::fwrite(head.data(), 1, head.size(), f) == head.size() &&
             std::fwrite(payload.data(), 1, payload.size(), f) == payload.size();
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[xla] could not write the executable cache: %s\n", e.what());
  }
}

}  // namespace tessera::xla
