// Compiled XLA executables on disk (TESSERA_CACHE_DIR/xla, decision 0045): each entry is the
// plugin's serialized executable under a key of everything it depends on (the plugin's identity
// line, the compile options, the StableHLO text), with a header that repeats the key and a
// checksum of the payload, so a second process loads instead of compiling and a corrupt,
// truncated or foreign file is detected (one warning line, then a recompile), never trusted.
#pragma once
#include <string>

namespace tessera::xla {

// The entry's file: <dir>/xla/<64-bit key in hex>.pjrt.
std::string executable_cache_path(const std::string& dir, const std::string& identity,
                                  const std::string& options, const std::string& module);
// The payload of the entry at `path` when it exists and matches the key and its checksum; false
// otherwise (with one "[xla] ignoring ..." warning line when the file exists but is unusable).
bool load_cached_executable(const std::string& path, const std::string& identity,
                            const std::string& options, const std::string& module,
                            std::string* payload);
// Writes the entry atomically (a temporary file renamed over it); a failure is one warning line.
void store_cached_executable(const std::string& path, const std::string& identity,
                             const std::string& options, const std::string& module,
                             const std::string& payload);

}  // namespace tessera::xla
