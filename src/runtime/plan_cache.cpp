#include "runtime/plan_cache.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "runtime/atomic_file.h"

namespace tessera::graph_detail {
namespace {

constexpr int kPlanFormat = 2;  // bump when the plan file layout or planning rules change

uint64_t text_checksum(const std::string& s) {
  Hasher h;
  h.add_string(s);
  return h.value();
}

}  // namespace

std::string plan_path(const std::string& dir, uint64_t fingerprint) {
  return (std::filesystem::path(dir) / ("plan-" + hex64(fingerprint) + ".tplan")).string();
}

namespace {
std::string plan_header(uint64_t fingerprint) {
  return "tessera-plan " + std::to_string(kPlanFormat) + " " + TESSERA_VERSION + " " +
         hex64(fingerprint);
}

}  // namespace

bool load_plan(const std::string& path, uint64_t fingerprint, Grouping* grouping,
               MemoryPlan* mem) {
  std::vector<int>* slot_of = &mem->slot_of;
  std::vector<size_t>* slot_bytes = &mem->slot_bytes;
  std::string text;
  if (!read_whole_file(path, &text)) return false;
  auto warn = [&](const char* why) {
    std::fprintf(stderr, "[compile] ignoring the plan cache file %s: %s\n", path.c_str(), why);
    return false;
  };
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) return warn("truncated");
  if (text.substr(0, nl) != plan_header(fingerprint))
    return warn("written by another tessera version or plan format");
  const size_t last = text.rfind("checksum ");
  if (last == std::string::npos || last < nl) return warn("no checksum (truncated)");
  const std::string body = text.substr(nl + 1, last - nl - 1);
  if (text.substr(last) != "checksum " + hex64(text_checksum(body)) + "\n")
    return warn("checksum mismatch (corrupt)");
  std::istringstream in(body);
  std::string word;
  int64_t n = 0;
  if (!(in >> word >> n) || word != "units" || n < 0) return warn("malformed units");
  grouping->assign(size_t(n), {});
  for (auto& unit : *grouping) {
    int64_t len = 0;
    if (!(in >> len) || len <= 0) return warn("malformed unit");
    unit.resize(size_t(len));
    for (auto& i : unit)
      if (!(in >> i)) return warn("malformed unit");
  }
  if (!(in >> word >> n) || word != "slots" || n < 0) return warn("malformed slots");
  slot_bytes->resize(size_t(n));
  for (auto& b : *slot_bytes)
    if (!(in >> b)) return warn("malformed slots");
  if (!(in >> word >> n) || word != "values" || n < 0) return warn("malformed values");
  slot_of->resize(size_t(n));
  for (auto& s : *slot_of)
    if (!(in >> s)) return warn("malformed values");
  return true;
}

void store_plan(const std::string& path, uint64_t fingerprint, const Grouping& grouping,
                const MemoryPlan& p) {
  std::ostringstream body;
  body << "units " << grouping.size() << "\n";
  for (const auto& unit : grouping) {
    body << unit.size();
    for (int64_t i : unit) body << " " << i;
    body << "\n";
  }
  body << "slots " << p.slot_bytes.size() << "\n";
  for (size_t b : p.slot_bytes) body << b << " ";
  body << "\nvalues " << p.slot_of.size() << "\n";
  for (int s : p.slot_of) body << s << " ";
  body << "\n";
  const std::string text = plan_header(fingerprint) + "\n" + body.str() + "checksum " +
                           hex64(text_checksum(body.str())) + "\n";
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomically(path, [&](std::FILE* f) {
      return std::fwrite(text.data(), 1, text.size(), f) == text.size();
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[compile] could not write the plan cache file: %s\n", e.what());
  }
}

}  // namespace tessera::graph_detail
