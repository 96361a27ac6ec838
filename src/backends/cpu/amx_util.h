// AMX tile configuration shared by the *_amx.cpp kernels (include only from files built with
// -mamx-tile). Each kernel configures the tiles on every thread at the start of its parallel
// region and releases them at the end: oneDNN (and other kernels) may reconfigure the same
// thread's tiles in between, so a cached configuration could be stale.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace tessera::amx {

// The 64-byte operand of LDTILECFG (palette 1: 8 tiles of up to 16 rows x 64 bytes).
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};

  TileConfig& tile(int t, int n_rows, int bytes_per_row) {
    rows[t] = uint8_t(n_rows);
    colsb[t] = uint16_t(bytes_per_row);
    return *this;
  }
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads exactly 64 bytes");

// Loads a configuration for the lifetime of the scope on this thread, releases the tiles after.
class TileScope {
 public:
  explicit TileScope(const TileConfig& cfg) { _tile_loadconfig(&cfg); }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

}  // namespace tessera::amx
