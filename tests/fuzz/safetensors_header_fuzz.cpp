// libFuzzer target for the safetensors header parser: any input must either parse into entries
// that lie inside the buffer or throw tessera::Error; anything else (another exception, a
// sanitizer report, an out-of-bounds read) is a bug. Built and run by run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "io/safetensors.h"
#include "runtime/error.h"

namespace {

void check(const std::vector<tessera::SafetensorsEntry>& entries, size_t data_bytes) {
  for (const auto& e : entries) {
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= uint64_t(d);
    if (e.begin > e.end || e.end > data_bytes ||
        e.end - e.begin != numel * tessera::dtype_size(e.dtype))
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> metadata;
  // As a whole file: length prefix, header, data section.
  try {
    size_t start = 0;
    const auto entries = tessera::parse_safetensors_buffer(data, size, "fuzz", &metadata, &start);
    if (start > size) __builtin_trap();
    check(entries, size - start);
  } catch (const tessera::Error&) {
  }
  // As a bare header, so mutations reach the JSON validation without a matching prefix.
  try {
    const size_t data_bytes = size * 4;
    check(tessera::parse_safetensors_header(reinterpret_cast<const char*>(data), size, data_bytes,
                                            "fuzz", &metadata),
          data_bytes);
  } catch (const tessera::Error&) {
  }
  return 0;
}
