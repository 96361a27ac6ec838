// Files of the on-disk caches (compiled plans, XLA executables). Atomic output: write a temporary
// file next to the target, flush it to disk, then rename it over the target, so readers never see
// a partial file and a failure leaves nothing behind.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace tessera {

// `write` fills the open temporary file and returns false on failure (it may also throw).
// Throws tessera::Error "<path>: <problem>" when anything fails; the temporary is removed.
void write_file_atomically(const std::string& path, const std::function<bool(std::FILE*)>& write);

// The whole file as bytes; false when it cannot be opened (a cache miss, not an error).
bool read_whole_file(const std::string& path, std::string* bytes);

// 16 lower-case hex digits: cache file names and checksums.
std::string hex64(uint64_t v);

}  // namespace tessera
