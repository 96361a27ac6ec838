// Compiled mode's on-disk plan cache (TESSERA_CACHE_DIR): a program's fusion grouping and memory
// plan stored as text under its structural fingerprint, with a header and a checksum.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/graph_plan.h"

namespace tessera::graph_detail {

std::string plan_path(const std::string& dir, uint64_t fingerprint);
// Reads a plan file; false (after one warning line) when it is missing, stale or corrupt.
bool load_plan(const std::string& path, uint64_t fingerprint, Grouping* grouping, MemoryPlan* mem);
// Writes atomically; a failure is one warning line.
void store_plan(const std::string& path, uint64_t fingerprint, const Grouping& grouping,
                const MemoryPlan& mem);

}  // namespace tessera::graph_detail
