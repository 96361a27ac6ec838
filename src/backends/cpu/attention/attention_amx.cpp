// bf16 SDPA on AMX tiles: K and V are repacked once per call into the tiles' VNNI layout, then
// each (batch, head, block of 256 queries) streams key blocks of 512 and, per 32-query strip,
// computes S = Q K^T in fp32 tiles, runs the online softmax on it (the same row kernel and
// numerics as the oneDNN path) and adds P V with P rounded to bf16, as torch does. The strips are
// software-pipelined so the TMUL unit and the vector units work at the same time.
// See docs/decisions/0003-attention-kernel.md.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/cpu/attention/attention_kernels.h"
#include "backends/cpu/attention/attention_row_avx512.h"
#include "runtime/cpu_features.h"
#include "runtime/error.h"
#include "runtime/parallel.h"
#include "runtime/tensor.h"

namespace tessera::cpu {
namespace {

constexpr int64_t kQBlock = 256;  // queries per work item: K/V blocks stay in L2 across strips
constexpr int64_t kStrip = 32;    // queries per tile pass: two 16-row A tiles
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

struct Aligned {
  void* p = nullptr;
  explicit Aligned(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)) {
    TESSERA_CHECK(p, "[scaled_dot_product_attention] out of memory for ", bytes, " bytes");
  }
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Palette 1, tiles 0-7 all 16 rows x 64 bytes: C tiles 0-3 (2x2 fp32 16x16), A tiles 4-5, B 6-7.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

struct TileScope {
  TileScope() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
  }
  ~TileScope() { _tile_release(); }
};

// K (Lk x D) -> B tiles of K^T: per 16 keys and 32 dims, 16 rows (dim pairs) x 16 keys x 2.
// Keys past Lk up to Lkp are zero.
void pack_k(const SdpaArgs& a, int64_t b, int64_t hk, int64_t Lkp, uint32_t* dst) {
  const int64_t nc = a.D / 32, pairs = a.D / 2;
  for (int64_t j = 0; j < Lkp; ++j) {
    uint32_t* tile = dst + (j / 16) * nc * 256 + j % 16;
    if (j >= a.Lk) {
      for (int64_t p = 0; p < pairs; ++p) tile[(p / 16) * 256 + (p % 16) * 16] = 0;
      continue;
    }
    const uint32_t* src = reinterpret_cast<const uint32_t*>(a.krow(b, hk, j));
    for (int64_t p = 0; p < pairs; ++p) tile[(p / 16) * 256 + (p % 16) * 16] = src[p];
  }
}

// V (Lk x Dv) -> B tiles: per 32 keys and 16 columns, 16 rows (key pairs) x 16 columns x 2.
void pack_v(const SdpaArgs& a, int64_t b, int64_t hk, int64_t Lkp, uint16_t* dst) {
  const int64_t nct = a.Dv / 16;
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t j = 0; j < Lkp; j += 2) {
    const uint16_t* r0 = j < a.Lk ? reinterpret_cast<const uint16_t*>(a.vrow(b, hk, j)) : nullptr;
    const uint16_t* r1 =
        j + 1 < a.Lk ? reinterpret_cast<const uint16_t*>(a.vrow(b, hk, j + 1)) : nullptr;
    uint16_t* row = dst + (j / 32) * nct * 512 + ((j % 32) / 2) * 32;
    for (int64_t ct = 0; ct < nct; ++ct) {
      const __m256i x0 =
          r0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + ct * 16)) : zero;
      const __m256i x1 =
          r1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + ct * 16)) : zero;
      const __m512i lo = _mm512_cvtepu16_epi32(x0);
      const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(x1), 16);
      _mm512_storeu_si512(row + ct * 512, _mm512_or_si512(lo, hi));
    }
  }
}

// The tile products of one pipeline stage, issued one tdpbf16ps (with the loads it needs) per
// step(): P V of the previous strip, then Q K^T of the next. C tiles 0-3 are shared, so the two
// run in order. One product per call keeps few tile ops ahead of the softmax's vector work in the
// out-of-order window, which is what lets the two overlap (coarser steps overlapped less).
struct TilePump {
  // P V: acc (32 x Dv) += P (32 x kvp) V
  const uint16_t* p = nullptr;
  int64_t ldp = 0, pv_kvp = 0, Dv = 0;
  const uint16_t* vblk = nullptr;
  float* acc = nullptr;
  // Q K^T: S (32 x kvp) = Q (32 x D) K^T
  const uint16_t* q = nullptr;
  int64_t D = 0, qk_kvp = 0, lds = 0;
  const uint32_t* kblk = nullptr;
  float* s = nullptr;
  int phase = 2;  // 0: P V, 1: Q K^T, 2: done
  int64_t outer = 0, inner = 0;
  int quarter = 0;  // each step issues one of the four products of a 2x2 tile step

  int64_t steps() const {
    return 4 * ((acc ? (Dv / 32) * (pv_kvp / 32) : 0) + (s ? (qk_kvp / 32) * (D / 32) : 0));
  }
  void start() {
    phase = acc ? 0 : s ? 1 : 2;
    outer = inner = 0;
    quarter = 0;
  }
  bool step() {
    if (phase == 0) {
      const int64_t c = outer, k = inner, ldc = Dv * 4;
      if (k == 0 && quarter == 0) {
        _tile_loadd(0, acc + c, ldc);
        _tile_loadd(1, acc + c + 16, ldc);
        _tile_loadd(2, acc + 16 * Dv + c, ldc);
        _tile_loadd(3, acc + 16 * Dv + c + 16, ldc);
      }
      const uint16_t* v0 = vblk + ((k / 32) * (Dv / 16) + c / 16) * 512;
      switch (quarter) {
        case 0:
          _tile_loadd(4, p + k, ldp * 2);
          _tile_loadd(6, v0, 64);
          _tile_dpbf16ps(0, 4, 6);
          quarter = 1;
          return true;
        case 1:
          _tile_loadd(7, v0 + 512, 64);
          _tile_dpbf16ps(1, 4, 7);
          quarter = 2;
          return true;
        case 2:
          _tile_loadd(5, p + 16 * ldp + k, ldp * 2);
          _tile_dpbf16ps(2, 5, 6);
          quarter = 3;
          return true;
      }
      quarter = 0;
      _tile_dpbf16ps(3, 5, 7);
      inner += 32;
      if (inner == pv_kvp) {
        _tile_stored(0, acc + c, ldc);
        _tile_stored(1, acc + c + 16, ldc);
        _tile_stored(2, acc + 16 * Dv + c, ldc);
        _tile_stored(3, acc + 16 * Dv + c + 16, ldc);
        inner = 0;
        outer += 32;
        if (outer == Dv) {
          outer = 0;
          phase = s ? 1 : 2;
        }
      }
      return true;
    }
    if (phase == 1) {
      const int64_t n = outer, c = inner, nc = D / 32;
      if (c == 0 && quarter == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      const uint32_t* k0 = kblk + (n / 16) * nc * 256;
      switch (quarter) {
        case 0:
          _tile_loadd(4, q + c * 32, D * 2);
          _tile_loadd(6, k0 + c * 256, 64);
          _tile_dpbf16ps(0, 4, 6);
          quarter = 1;
          return true;
        case 1:
          _tile_loadd(7, k0 + nc * 256 + c * 256, 64);
          _tile_dpbf16ps(1, 4, 7);
          quarter = 2;
          return true;
        case 2:
          _tile_loadd(5, q + 16 * D + c * 32, D * 2);
          _tile_dpbf16ps(2, 5, 6);
          quarter = 3;
          return true;
      }
      quarter = 0;
      _tile_dpbf16ps(3, 5, 7);
      if (++inner == nc) {
        _tile_stored(0, s + n, lds * 4);
        _tile_stored(1, s + n + 16, lds * 4);
        _tile_stored(2, s + 16 * lds + n, lds * 4);
        _tile_stored(3, s + 16 * lds + n + 16, lds * 4);
        inner = 0;
        outer += 32;
        if (outer == qk_kvp) phase = 2;
      }
      return true;
    }
    return false;
  }
};

void scale_row(float* x, int64_t n, float f) {
  const __m512 vf = _mm512_set1_ps(f);
  for (int64_t j = 0; j < n; j += 16)
    _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), vf));
}

}  // namespace

bool sdpa_amx(const SdpaArgs& a) {
  if (!a.bf16 || cpu_isa() < CpuIsa::amx_bf16 || a.D % 32 != 0 || a.Dv % 32 != 0) return false;
  const int64_t KB = std::min(kSdpaKeyBlock, a.Lk), KBp = round_up(KB, 32);
  // Row strides of S and P padded by one cache line: power-of-two strides make the 16 rows of a
  // tile load/store collide in a few L1 sets.
  const int64_t lds = KBp + 16, ldp = KBp + 32;
  const int64_t Lkp = round_up(a.Lk, 32), rep = a.H / a.Hkv;
  const int64_t QB = round_up(std::min(kQBlock, a.Lq), kStrip), nqb = (a.Lq + QB - 1) / QB;

  // Pack every kv head once; they are read by all (H / Hkv) x nqb work items of that head.
  const size_t k_elems = size_t(Lkp * a.D), v_elems = size_t(Lkp * a.Dv);
  // From the caching allocator: the same sizes recur every call, so no fresh pages each time.
  const Tensor kpack = Tensor::empty({int64_t(size_t(a.B * a.Hkv) * k_elems)}, DType::bf16);
  const Tensor vpack = Tensor::empty({int64_t(size_t(a.B * a.Hkv) * v_elems)}, DType::bf16);
  uint32_t* kp = static_cast<uint32_t*>(kpack.raw_data());
  uint16_t* vp = static_cast<uint16_t*>(vpack.raw_data());
  parallel_for(a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      pack_k(a, w / a.Hkv, w % a.Hkv, Lkp, kp + size_t(w) * k_elems / 2);
      pack_v(a, w / a.Hkv, w % a.Hkv, Lkp, vp + size_t(w) * v_elems);
    }
  });

  parallel_for(a.B * a.H * nqb, 1, [&](int64_t begin, int64_t end) {
    TileScope tiles;
    Aligned qbuf(size_t(QB * a.D) * 2), acc(size_t(QB * a.Dv) * 4), ml(size_t(QB) * 8),
        S(size_t(2 * kStrip * lds) * 4), P(size_t(2 * kStrip * ldp) * 2), add(size_t(KBp) * 4);
    uint16_t* q = qbuf.as<uint16_t>();
    float* m = ml.as<float>();
    float* l = m + QB;
    for (int64_t w = begin; w < end; ++w) {
      const int64_t qb_i = w % nqb, h = (w / nqb) % a.H, b = w / (nqb * a.H), hk = h / rep;
      const int64_t q0 = qb_i * QB, qn = std::min(QB, a.Lq - q0), qnp = round_up(qn, kStrip);
      for (int64_t r = 0; r < qn; ++r) std::memcpy(q + r * a.D, a.qrow(b, h, q0 + r), a.D * 2);
      std::memset(q + qn * a.D, 0, size_t((qnp - qn) * a.D) * 2);
      std::fill(m, m + qnp, kNegInf);
      std::fill(l, l + qnp, 0.f);
      std::memset(acc.p, 0, size_t(qnp * a.Dv) * 4);
      const uint32_t* kh = kp + size_t(b * a.Hkv + hk) * k_elems / 2;
      const uint16_t* vh = vp + size_t(b * a.Hkv + hk) * v_elems;
      const int64_t kend = a.causal ? std::min(a.Lk, q0 + qn) : a.Lk;
      for (int64_t k0 = 0; k0 < kend; k0 += KB) {
        const int64_t kn = std::min(KB, a.Lk - k0);
        struct Strip {
          int64_t r0, rows, kvp;
          float* s;
          uint16_t* p;
        };
        Strip strips[kQBlock / kStrip];
        int64_t n = 0;
        for (int64_t r0 = 0; r0 < qn; r0 += kStrip) {
          const int64_t rows = std::min(kStrip, qn - r0), i_last = q0 + r0 + rows - 1;
          if (a.causal && k0 > i_last) continue;
          // Causal: keys past the strip's last query are masked for all its rows.
          const int64_t kv = a.causal ? std::min(kn, i_last - k0 + 1) : kn;
          strips[n] = {r0, rows, round_up(kv, 32), S.as<float>() + (n % 2) * kStrip * lds,
                       P.as<uint16_t>() + (n % 2) * kStrip * ldp};
          ++n;
        }
        if (n == 0) continue;
        const uint32_t* kblk = kh + (k0 / 16) * (a.D / 32) * 256;
        const uint16_t* vblk = vh + (k0 / 32) * (a.Dv / 16) * 512;
        // Software pipeline: while the softmax of strip t runs, the pump issues the tile products
        // P V of strip t - 1 and Q K^T of strip t + 1 (S and P are double-buffered).
        TilePump first;
        first.q = q + strips[0].r0 * a.D, first.D = a.D, first.qk_kvp = strips[0].kvp;
        first.lds = lds, first.kblk = kblk, first.s = strips[0].s;
        first.start();
        while (first.step()) {
        }
        for (int64_t t = 0; t <= n; ++t) {
          TilePump pump;
          if (t > 0) {
            const Strip& pv = strips[t - 1];
            pump.p = pv.p, pump.ldp = ldp, pump.pv_kvp = pv.kvp, pump.Dv = a.Dv;
            pump.vblk = vblk, pump.acc = acc.as<float>() + pv.r0 * a.Dv;
          }
          if (t + 1 < n) {
            const Strip& nx = strips[t + 1];
            pump.q = q + nx.r0 * a.D, pump.D = a.D, pump.qk_kvp = nx.kvp, pump.lds = lds;
            pump.kblk = kblk, pump.s = nx.s;
          }
          pump.start();
          if (t < n) {
            const Strip& cur = strips[t];
            const int64_t vecs = std::max<int64_t>(1, cur.rows * (kn / 16));
            const int64_t every = std::max<int64_t>(1, vecs / std::max<int64_t>(1, pump.steps()));
            int64_t tick = 0;
            auto issue = [&] {
              if (++tick == every) {
                tick = 0;
                pump.step();
              }
            };
            for (int64_t r = 0; r < cur.rows; ++r) {
              const int64_t i = q0 + cur.r0 + r;
              const int64_t nvalid = a.causal ? std::clamp<int64_t>(i - k0 + 1, 0, kn) : kn;
              const float* addp = nullptr;
              if (a.mask && nvalid > 0) {
                sdpa_mask_row(a, b, h, i, k0, nvalid, add.as<float>());
                addp = add.as<float>();
              }
              uint16_t* prow = cur.p + r * ldp;
              const float alpha =
                  avx512::softmax_row<true>(cur.s + r * lds, kn, nvalid, a.scale, addp,
                                            m + cur.r0 + r, l + cur.r0 + r, prow, true, issue);
              if (cur.kvp > kn) std::memset(prow + kn, 0, size_t(cur.kvp - kn) * 2);
              if (alpha != 1.f) scale_row(acc.as<float>() + (cur.r0 + r) * a.Dv, a.Dv, alpha);
            }
          }
          while (pump.step()) {
          }
        }
      }
      for (int64_t r = 0; r < qn; ++r) {
        const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;  // fully masked rows give 0, as torch
        const float* row = acc.as<float>() + r * a.Dv;
        uint16_t* o = reinterpret_cast<uint16_t*>(a.orow(b, h, q0 + r));
        const __m512 vi = _mm512_set1_ps(inv);
        for (int64_t d = 0; d < a.Dv; d += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d),
                              avx512::to_bf16(_mm512_mul_ps(_mm512_loadu_ps(row + d), vi)));
      }
    }
  });
  return true;
}

}  // namespace tessera::cpu
