// bf16 GEMM on AMX tiles (gemm_amx.h). The micro-kernel keeps a 32x32 fp32 block of C in four
// tiles (2 row tiles of A x 2 column tiles of B per 32-wide K step). B is packed once per weight;
// each thread packs the rows of A it owns, a group of kMc 32-row blocks at a time, into
// [block][K/32][32][32] and runs every column panel (kNc wide) of that group; within a panel,
// K in chunks of kKc, so a chunk of A (32 KiB) stays in L1 across the panel (B is read with
// streaming tile loads so it does not evict it) and the B chunk (512 KiB) in L2 across the group;
// partial sums wait in a per-thread fp32 buffer laid out as tiles, the next block's prefetched.
// Blocking measured on this machine's Xeon (docs/decisions/0002-gemm-library.md).
#include "backends/cpu/gemm/gemm_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backends/cpu/amx_util.h"
#include "runtime/parallel.h"

// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tessera::amx_gemm {
namespace {

constexpr int64_t kMc = 16;   // row blocks (of 32) per group
constexpr int64_t kKc = 512;  // K chunk
constexpr int64_t kNc = 512;  // panel width

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Per-thread buffer of partial sums: kMc blocks x panel, as [block][32-col block][4 tiles].
struct Scratch {
  std::vector<float> c;
  float* cbuf(size_t n) {
    if (c.size() < n + 16) c.resize(n + 16);
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(c.data()) + 63) & ~uintptr_t(63));
  }
};

// Where tile step kt of block mbi (of nmb) starts in a packed group of A: K chunks outermost,
// so the blocks' A chunks used together are contiguous (a block-major layout would put them a
// multiple of the L2 way size apart at K = 12288, all in the same cache sets).
inline int64_t a_offset(int64_t mbi, int64_t kt, int64_t nmb, int64_t KT) {
  constexpr int64_t kc_t = kKc / 32;
  const int64_t c = kt / kc_t, kt_n = std::min(kc_t, KT - c * kc_t);
  return (c * nmb * kc_t + mbi * kt_n + kt % kc_t) * 1024;
}

// A rows [m0, m0 + rows) (block mbi of a group of nmb) into the group at `out`, as [32][32]
// tiles per K step, zero-padded past M and K.
void pack_a(const Problem& p, int64_t m0, int64_t rows, int64_t KT, int64_t nmb, int64_t mbi,
            uint16_t* out) {
  // Row by row, so the source is read sequentially.
  for (int64_t r = 0; r < 32; ++r) {
    const uint16_t* s = r < rows ? p.a + (m0 + r) * p.sam : nullptr;
    for (int64_t kt = 0; kt < KT; ++kt) {
      uint16_t* d = out + a_offset(mbi, kt, nmb, KT) + r * 32;
      const int64_t kb = kt * 32, kn = std::min<int64_t>(32, p.K - kb);
      if (!s) {
        std::memset(d, 0, 64);
      } else if (p.sak == 1) {
        const __mmask32 mask = kn == 32 ? ~__mmask32(0) : ((__mmask32(1) << kn) - 1);
        _mm512_storeu_si512(d, _mm512_maskz_loadu_epi16(mask, s + kb));
      } else {
        for (int64_t k = 0; k < 32; ++k) d[k] = k < kn ? s[(kb + k) * p.sak] : 0;
      }
    }
  }
}

// One 32x32 fp32 block (four 16x16 tiles, row-major tiles in row-major order) + bias, rounded
// once to bf16 (round to nearest even, as torch): rows x cols of it into c.
void store_block(const float* f, int64_t rows, int64_t cols, const float* bias, uint16_t* c,
                 int64_t ldc) {
  for (int64_t h = 0; h < 2; ++h) {
    const int64_t n = std::min<int64_t>(16, cols - h * 16);
    if (n <= 0) break;
    const __mmask16 m = n == 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + h * 16) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = f + ((r / 16) * 2 + h) * 256 + (r % 16) * 16;
      const __m512 v = _mm512_add_ps(_mm512_load_ps(src), bv);
      _mm256_mask_storeu_epi16(c + r * ldc + h * 16, m,
                               reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
  }
}

// C block (four 16x16 fp32 tiles at cf, contiguous) += packed A chunk (kt_n steps of 32x32) x
// packed B block. kTwoRows: the second 16-row tile is live (blocks of <= 16 rows skip it).
template <bool kTwoRows>
inline void block_32x32(const uint16_t* a, const uint16_t* b, int64_t kt_n, float* cf, bool first,
                        bool prefetch_c = false) {
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    if (kTwoRows) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, cf + 0, 64);
    _tile_loadd(1, cf + 256, 64);
    if (kTwoRows) {
      _tile_loadd(2, cf + 512, 64);
      _tile_loadd(3, cf + 768, 64);
    }
  }
  for (int64_t kt = 0; kt < kt_n; ++kt) {
    const uint16_t* ap = a + kt * 1024;
    const uint16_t* bp = b + kt * 1024;
    if (prefetch_c) {
      // The next block's partial sums (4 KiB, in L2) into L1 while this block computes, so
      // its tile loads do not wait on L2.
      constexpr int kLines = 64 / (kKc / 32);
      const char* q = reinterpret_cast<const char*>(cf + 1024) + kt * kLines * 64;
      for (int l = 0; l < kLines; ++l) _mm_prefetch(q + l * 64, _MM_HINT_T0);
    }
    _tile_loadd(4, ap, 64);
    // B is used once per visit: streaming loads keep it from evicting the A chunk from L1.
    _tile_stream_loadd(6, bp, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_stream_loadd(7, bp + 512, 64);
    _tile_dpbf16ps(1, 4, 7);
    if (kTwoRows) {
      _tile_loadd(5, ap + 512, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, cf + 0, 64);
  _tile_stored(1, cf + 256, 64);
  if (kTwoRows) {
    _tile_stored(2, cf + 512, 64);
    _tile_stored(3, cf + 768, 64);
  }
}

// Row blocks [mb0, mb1) (32 rows each) x columns [n0, n1) (n0 a multiple of 32) of one problem,
// with those rows of A packed as one group at a_packed (a_offset).
void run_range(const Problem& p, const uint16_t* a_packed, int64_t mb0, int64_t mb1, int64_t n0,
               int64_t n1, Scratch& s) {
  const int64_t KT = round_up(p.K, 32) / 32, ldf = round_up(n1 - n0, 32);
  if (KT <= kKc / 32) {
    // One K chunk: each block is final at once; round it out while it is still in L1.
    float* cf = s.cbuf(1024);
    for (int64_t mb = mb0; mb < mb1; ++mb) {
      const int64_t m0 = mb * 32, rows = std::min<int64_t>(32, p.M - m0);
      const uint16_t* a = a_packed + a_offset(mb - mb0, 0, mb1 - mb0, KT);
      for (int64_t n = n0; n < std::min(n1, p.N); n += 32) {
        const uint16_t* b = p.b_packed + (n / 32) * KT * 1024;
        if (rows > 16)
          block_32x32<true>(a, b, KT, cf, true);
        else
          block_32x32<false>(a, b, KT, cf, true);
        store_block(cf, rows, std::min<int64_t>(32, p.N - n), p.bias ? p.bias + n : nullptr,
                    p.c + m0 * p.ldc + n, p.ldc);
      }
    }
    return;
  }
  float* cf_all = s.cbuf(size_t(32 * ldf * (mb1 - mb0)));
  for (int64_t kt0 = 0; kt0 < KT; kt0 += kKc / 32) {
    const int64_t kt_n = std::min(kKc / 32, KT - kt0);
    for (int64_t mb = mb0; mb < mb1; ++mb) {
      const int64_t rows = std::min<int64_t>(32, p.M - mb * 32);
      const uint16_t* a = a_packed + a_offset(mb - mb0, kt0, mb1 - mb0, KT);
      float* cf = cf_all + (mb - mb0) * 32 * ldf;
      for (int64_t n = n0; n < n1; n += 32) {
        const uint16_t* b = p.b_packed + ((n / 32) * KT + kt0) * 1024;
        const bool pf = kt_n == kKc / 32;  // prefetch never faults: past the last block is fine
        if (rows > 16)
          block_32x32<true>(a, b, kt_n, cf + (n - n0) * 32, kt0 == 0, pf);
        else
          block_32x32<false>(a, b, kt_n, cf + (n - n0) * 32, kt0 == 0, pf);
      }
    }
  }
  const int64_t cols = std::min(n1, p.N) - n0;
  for (int64_t mb = mb0; mb < mb1; ++mb) {
    const int64_t m0 = mb * 32, rows = std::min<int64_t>(32, p.M - m0);
    for (int64_t n = n0; n < n0 + cols; n += 32)
      store_block(cf_all + (mb - mb0) * 32 * ldf + (n - n0) * 32, rows,
                  std::min<int64_t>(32, n0 + cols - n), p.bias ? p.bias + n : nullptr,
                  p.c + m0 * p.ldc + n, p.ldc);
  }
}

// r[i] (16 x 32-bit) := column i of the 16x16 matrix whose rows are r[0..15].
void transpose16x16_epi32(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // u[4g + j], 128-bit lane L: column 4L + j of rows 4g..4g+3.
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    r[j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
    r[j + 4] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[j + 12] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
  }
}

}  // namespace

namespace {
std::atomic<bool> g_enabled{true};
}  // namespace
bool enabled() {
  return g_enabled.load(std::memory_order_relaxed);
}
void set_enabled(bool on) {
  g_enabled.store(on);
}

size_t packed_b_elems(int64_t K, int64_t N) {
  return size_t(round_up(K, 32)) * size_t(round_up(N, 32));
}

void pack_b(const uint16_t* b, int64_t sk, int64_t sn, int64_t K, int64_t N, uint16_t* out) {
  const int64_t KT = round_up(K, 32) / 32, NB = round_up(N, 32) / 32;
  parallel_for(NB, 2, [&](int64_t nb0, int64_t nb1) {
    for (int64_t nb = nb0; nb < nb1; ++nb)
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t nbase = nb * 32 + half * 16;
        for (int64_t kt = 0; kt < KT; ++kt) {
          uint16_t* dst = out + ((nb * KT + kt) * 2 + half) * 512;
          const int64_t kbase = kt * 32, kn = std::min<int64_t>(32, K - kbase);
          if (sk == 1) {
            // Linear's weight (k contiguous): a 16x16 transpose of k-pairs.
            const __mmask32 km = kn == 32 ? ~__mmask32(0) : ((__mmask32(1) << kn) - 1);
            __m512i r[16];
            for (int64_t c = 0; c < 16; ++c)
              r[c] = nbase + c < N ? _mm512_maskz_loadu_epi16(km, b + (nbase + c) * sn + kbase)
                                   : _mm512_setzero_si512();
            transpose16x16_epi32(r);
            for (int64_t q = 0; q < 16; ++q) _mm512_storeu_si512(dst + q * 32, r[q]);
            continue;
          }
          for (int64_t c = 0; c < 16; ++c) {
            const int64_t n = nbase + c;
            for (int64_t kk = 0; kk < 32; ++kk)
              dst[(kk / 2) * 32 + c * 2 + (kk & 1)] =
                  n < N && kk < kn ? b[(kbase + kk) * sk + n * sn] : 0;
          }
        }
      }
  });
}

void gemm(const std::vector<Problem>& problems) {
  // Work items: (problem, group of kMc row blocks, column panel), in that order; each thread
  // takes a contiguous range, packs a group's rows of A once (into its own buffer, which stays
  // in cache) and runs every panel of it.
  struct Plan {
    int64_t mblocks, groups, panels, nc, first_item;
  };
  const int64_t threads = num_threads();
  std::vector<Plan> plans;
  int64_t items = 0;
  for (const Problem& p : problems) {
    const bool empty = p.M <= 0 || p.N <= 0 || p.K <= 0;
    const int64_t mblocks = empty ? 0 : (p.M + 31) / 32, groups = (mblocks + kMc - 1) / kMc;
    const int64_t np = round_up(p.N, 32);
    int64_t nc = std::min(kNc, np);
    // Few row groups: narrower panels, so every thread gets work.
    while (nc > 32 && groups * ((np + nc - 1) / nc) < 2 * threads) nc = round_up(nc / 2, 32);
    const int64_t panels = (np + nc - 1) / nc;
    plans.push_back({mblocks, groups, panels, nc, items});
    items += groups * panels;
  }
  if (items == 0) return;
  const int64_t tasks = std::min(items, threads);
  parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    thread_local Scratch scratch;
    thread_local std::vector<uint16_t> a_buf;
    amx::TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.tile(t, 16, 64);
    amx::TileScope scope(cfg);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = items * t / tasks, i1 = items * (t + 1) / tasks;
      size_t pi = 0;
      int64_t packed_problem = -1, packed_group = -1;
      uint16_t* a = nullptr;
      for (int64_t i = i0; i < i1; ++i) {
        while (pi + 1 < plans.size() && plans[pi + 1].first_item <= i) ++pi;
        const Plan& pl = plans[pi];
        const Problem& p = problems[pi];
        const int64_t local = i - pl.first_item;
        const int64_t group = local / pl.panels, panel = local % pl.panels;
        const int64_t mb0 = group * kMc, mb1 = std::min(pl.mblocks, mb0 + kMc);
        const int64_t KT = round_up(p.K, 32) / 32;
        if (packed_problem != int64_t(pi) || packed_group != group) {
          const size_t need = size_t((mb1 - mb0) * KT * 1024) + 32;
          if (a_buf.size() < need) a_buf.resize(need);
          a = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(a_buf.data()) + 63) &
                                          ~uintptr_t(63));
          for (int64_t mb = mb0; mb < mb1; ++mb)
            pack_a(p, mb * 32, std::min<int64_t>(32, p.M - mb * 32), KT, mb1 - mb0, mb - mb0, a);
          packed_problem = int64_t(pi);
          packed_group = group;
        }
        const int64_t n0 = panel * pl.nc, n1 = std::min(n0 + pl.nc, round_up(p.N, 32));
        run_range(p, a, mb0, mb1, n0, n1, scratch);
      }
    }
  });
}

}  // namespace tessera::amx_gemm
