// f32 SDPA on AMX tiles: every f32 operand is split into bf16 parts (x = hi + lo, hi = bf16(x),
// lo = bf16(x - hi); optionally a third part) and each product is a short sum of bf16 tile
// products with fp32 accumulation (hi*hi + hi*lo + lo*hi by default). The TMUL runs bf16 ~8x
// faster than f32 FMAs, so even 3-6 tile products per product beat an FMA-peak kernel. The
// structure is attention_amx.cpp's (K/V packed once per call, 256-query work items, key blocks
// of 512, 32-query strips, software-pipelined tile products); the online softmax is the same f32
// row kernel as the oneDNN-tile path. See docs/decisions/0003-attention-kernel.md.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/cpu/amx_util.h"
#include "backends/cpu/attention/attention_kernels.h"
#include "backends/cpu/attention/attention_row_avx512.h"
#include "runtime/cpu_features.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/parallel.h"
#include "runtime/tensor.h"

namespace tessera::cpu {
namespace {

constexpr int64_t kQBlock = 256;  // queries per work item
constexpr int64_t kStrip = 32;    // queries per tile pass: two 16-row A tiles
constexpr int kMaxParts = 3;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Which bf16 part products make up one f32 product. Consecutive entries share an operand part
// where possible, so the pump can skip reloading that tile; small terms come first.
struct Prod {
  int8_t a, b;
};
struct Scheme {
  int parts, nprod;
  Prod prods[6];
};
constexpr Scheme kScheme3 = {2, 3, {{0, 1}, {0, 0}, {1, 0}}};
constexpr Scheme kScheme4 = {2, 4, {{1, 1}, {1, 0}, {0, 0}, {0, 1}}};
// Three levels: every term down to 2^-16 relative; the dropped ones are below 2^-24.
constexpr Scheme kScheme6 = {3, 6, {{1, 1}, {1, 0}, {2, 0}, {0, 0}, {0, 1}, {0, 2}}};

std::atomic<int> g_qk{0}, g_pv{0};

bool valid_products(int n) {
  return n == 3 || n == 4 || n == 6;
}

// (Q K^T products, P V products): set_sdpa_f32_products, else TESSERA_SDPA_F32_PRODUCTS=qk[,pv],
// else the defaults.
std::pair<int, int> products_setting() {
  int qk = g_qk.load(), pv = g_pv.load();
  if (qk == 0) {
    qk = kSdpaF32QkProducts, pv = kSdpaF32PvProducts;
    const std::string s = env::string(EnvVar::sdpa_f32_products);
    if (!s.empty()) {
      const size_t comma = s.find(',');
      const std::string a = s.substr(0, comma), b = comma == s.npos ? a : s.substr(comma + 1);
      qk = a.size() == 1 ? a[0] - '0' : 0, pv = b.size() == 1 ? b[0] - '0' : 0;
      if (!valid_products(qk) || !valid_products(pv))
        env::malformed(EnvVar::sdpa_f32_products, s, "expected qk[,pv], each 3, 4 or 6");
    }
  }
  return {qk, pv};
}

const Scheme& scheme_of(int n) {
  return n == 3 ? kScheme3 : n == 4 ? kScheme4 : kScheme6;
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

inline __m512 bf16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// x[0, n) -> parts[p][0, n): part 0 = bf16(x), part p = bf16 of what parts 0..p-1 leave (each
// subtraction is exact). n is a multiple of 16.
void split_row(const float* x, int64_t n, int parts, uint16_t* const* out) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512 r = _mm512_loadu_ps(x + j);
    for (int p = 0; p < parts; ++p) {
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(r);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[p] + j), h);
      if (p + 1 < parts) r = _mm512_sub_ps(r, bf16_to_f32(h));
    }
  }
}

// K (Lk x D, f32) -> per part, B tiles of K^T as attention_amx.cpp packs bf16 K: per 16 keys and
// 32 dims, 16 rows (dim pairs) x 16 keys x 2. Keys past Lk up to Lkp are zero.
void pack_k(const SdpaArgs& a, int64_t b, int64_t hk, int64_t Lkp, int parts, size_t part_elems,
            uint32_t* dst, uint16_t* tmp) {
  const int64_t nc = a.D / 32, pairs = a.D / 2;
  uint16_t* rows[kMaxParts];
  for (int p = 0; p < parts; ++p) rows[p] = tmp + p * a.D;
  for (int64_t j = 0; j < Lkp; ++j) {
    if (j < a.Lk)
      split_row(reinterpret_cast<const float*>(a.krow(b, hk, j)), a.D, parts, rows);
    else
      std::memset(tmp, 0, size_t(parts * a.D) * 2);
    for (int p = 0; p < parts; ++p) {
      uint32_t* tile = dst + p * part_elems / 2 + (j / 16) * nc * 256 + j % 16;
      const uint32_t* src = reinterpret_cast<const uint32_t*>(rows[p]);
      for (int64_t i = 0; i < pairs; ++i) tile[(i / 16) * 256 + (i % 16) * 16] = src[i];
    }
  }
}

// V (Lk x Dv, f32) -> per part, B tiles: per 32 keys and 16 columns, 16 rows (key pairs) x 16
// columns x 2.
void pack_v(const SdpaArgs& a, int64_t b, int64_t hk, int64_t Lkp, int parts, size_t part_elems,
            uint16_t* dst, uint16_t* tmp) {
  const int64_t nct = a.Dv / 16;
  uint16_t* r0[kMaxParts];
  uint16_t* r1[kMaxParts];
  for (int p = 0; p < parts; ++p) r0[p] = tmp + 2 * p * a.Dv, r1[p] = r0[p] + a.Dv;
  for (int64_t j = 0; j < Lkp; j += 2) {
    if (j < a.Lk)
      split_row(reinterpret_cast<const float*>(a.vrow(b, hk, j)), a.Dv, parts, r0);
    else
      for (int p = 0; p < parts; ++p) std::memset(r0[p], 0, size_t(a.Dv) * 2);
    if (j + 1 < a.Lk)
      split_row(reinterpret_cast<const float*>(a.vrow(b, hk, j + 1)), a.Dv, parts, r1);
    else
      for (int p = 0; p < parts; ++p) std::memset(r1[p], 0, size_t(a.Dv) * 2);
    for (int p = 0; p < parts; ++p) {
      uint16_t* row = dst + p * part_elems + (j / 32) * nct * 512 + ((j % 32) / 2) * 32;
      for (int64_t ct = 0; ct < nct; ++ct) {
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0[p] + ct * 16));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1[p] + ct * 16));
        const __m512i lo = _mm512_cvtepu16_epi32(x0);
        const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(x1), 16);
        _mm512_storeu_si512(row + ct * 512, _mm512_or_si512(lo, hi));
      }
    }
  }
}

// The tile products of one pipeline stage (P V of the previous strip, then Q K^T of the next),
// issued one tdpbf16ps per step() like attention_amx.cpp's pump, with the part products of each
// 32-deep chunk run back to back on the same 2x2 C tiles. An operand part shared with the
// previous product stays in its tiles.
struct SplitPump {
  const Scheme* qk_sc = nullptr;
  const Scheme* pv_sc = nullptr;
  const Scheme* sc = nullptr;  // the running phase's scheme
  // P V: acc (32 x Dv) += sum over products P[a] (32 x kvp) V[b]
  const uint16_t* p[kMaxParts] = {};
  int64_t ldp = 0, pv_kvp = 0, Dv = 0;
  const uint16_t* vblk[kMaxParts] = {};
  float* acc = nullptr;
  // Q K^T: S (32 x kvp) = sum over products Q[a] (32 x D) K[b]^T
  const uint16_t* q[kMaxParts] = {};
  int64_t D = 0, qk_kvp = 0, lds = 0;
  const uint32_t* kblk[kMaxParts] = {};
  float* s = nullptr;
  int phase = 2;  // 0: P V, 1: Q K^T, 2: done
  int64_t outer = 0, inner = 0;
  int prod = 0, quarter = 0;
  bool load_a = true, load_b = true;

  int64_t steps() const {
    return 4 * ((acc ? pv_sc->nprod * (Dv / 32) * (pv_kvp / 32) : 0) +
                (s ? qk_sc->nprod * (qk_kvp / 32) * (D / 32) : 0));
  }
  void start() {
    phase = acc ? 0 : s ? 1 : 2;
    sc = phase == 0 ? pv_sc : qk_sc;
    outer = inner = 0;
    prod = quarter = 0;
  }
  // Which operand tiles the current product must load.
  void begin_product() {
    if (prod == 0) {
      load_a = load_b = true;
    } else {
      load_a = sc->prods[prod].a != sc->prods[prod - 1].a;
      load_b = sc->prods[prod].b != sc->prods[prod - 1].b;
    }
  }
  // One product's four tile steps: A tiles 4 (rows 0-15), 5 (rows 16-31); B tiles 6, 7.
  template <typename T, typename U>
  bool quarter_step(const T* a0, int64_t lda_bytes, const T* a1, const U* b0, const U* b1) {
    switch (quarter) {
      case 0:
        begin_product();
        if (load_a) _tile_loadd(4, a0, lda_bytes);
        if (load_b) _tile_loadd(6, b0, 64);
        _tile_dpbf16ps(0, 4, 6);
        quarter = 1;
        return false;
      case 1:
        if (load_b) _tile_loadd(7, b1, 64);
        _tile_dpbf16ps(1, 4, 7);
        quarter = 2;
        return false;
      case 2:
        if (load_a) _tile_loadd(5, a1, lda_bytes);
        _tile_dpbf16ps(2, 5, 6);
        quarter = 3;
        return false;
    }
    _tile_dpbf16ps(3, 5, 7);
    quarter = 0;
    if (++prod < sc->nprod) return false;
    prod = 0;
    return true;  // the chunk's products are done
  }

  bool step() {
    if (phase == 0) {
      const int64_t c = outer, k = inner, ldc = Dv * 4;
      if (k == 0 && prod == 0 && quarter == 0) {
        _tile_loadd(0, acc + c, ldc);
        _tile_loadd(1, acc + c + 16, ldc);
        _tile_loadd(2, acc + 16 * Dv + c, ldc);
        _tile_loadd(3, acc + 16 * Dv + c + 16, ldc);
      }
      const Prod pr = sc->prods[prod];
      const uint16_t* pa = p[pr.a] + k;
      const uint16_t* v0 = vblk[pr.b] + ((k / 32) * (Dv / 16) + c / 16) * 512;
      if (!quarter_step(pa, ldp * 2, pa + 16 * ldp, v0, v0 + 512)) return true;
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
          sc = qk_sc;
        }
      }
      return true;
    }
    if (phase == 1) {
      const int64_t n = outer, c = inner, nc = D / 32;
      if (c == 0 && prod == 0 && quarter == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      const Prod pr = sc->prods[prod];
      const uint16_t* qa = q[pr.a] + c * 32;
      const uint32_t* k0 = kblk[pr.b] + (n / 16) * nc * 256 + c * 256;
      if (!quarter_step(qa, D * 2, qa + 16 * D, k0, k0 + nc * 256)) return true;
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

void set_sdpa_f32_products(int qk, int pv) {
  const bool ok = (qk == 0 && pv == 0) || (valid_products(qk) && valid_products(pv));
  TESSERA_CHECK(ok, "[sdpa f32 products] ", qk, ", ", pv, " not supported, expected 3, 4 or 6");
  g_pv = pv;
  g_qk = qk;
}

bool sdpa_amx_f32(const SdpaArgs& a) {
  if (a.bf16 || cpu_isa() < CpuIsa::amx_bf16 || a.D % 32 != 0 || a.Dv % 32 != 0) return false;
  const auto [n_qk, n_pv] = products_setting();
  const Scheme &qk_sc = scheme_of(n_qk), &pv_sc = scheme_of(n_pv);
  const int qk_parts = qk_sc.parts, pv_parts = pv_sc.parts;
  const int64_t KB = std::min(kSdpaKeyBlock, a.Lk), KBp = round_up(KB, 32);
  // Row strides of S and P padded by one cache line (power-of-two strides collide in L1 sets).
  const int64_t lds = KBp + 16, ldp = KBp + 32;
  const int64_t Lkp = round_up(a.Lk, 32), rep = a.H / a.Hkv;
  const int64_t QB = round_up(std::min(kQBlock, a.Lq), kStrip), nqb = (a.Lq + QB - 1) / QB;

  // Pack every kv head once, all parts of a head together (bf16 elements per part).
  const size_t k_elems = size_t(Lkp * a.D), v_elems = size_t(Lkp * a.Dv);
  const int64_t heads = a.B * a.Hkv;
  const Tensor kpack = Tensor::empty({int64_t(size_t(heads * qk_parts) * k_elems)}, DType::bf16);
  const Tensor vpack = Tensor::empty({int64_t(size_t(heads * pv_parts) * v_elems)}, DType::bf16);
  uint16_t* kp = static_cast<uint16_t*>(kpack.raw_data());
  uint16_t* vp = static_cast<uint16_t*>(vpack.raw_data());
  parallel_for(heads, 1, [&](int64_t begin, int64_t end) {
    Aligned tmp(size_t(2 * kMaxParts * std::max(a.D, a.Dv)) * 2);
    for (int64_t w = begin; w < end; ++w) {
      pack_k(a, w / a.Hkv, w % a.Hkv, Lkp, qk_parts, k_elems,
             reinterpret_cast<uint32_t*>(kp + size_t(w * qk_parts) * k_elems), tmp.as<uint16_t>());
      pack_v(a, w / a.Hkv, w % a.Hkv, Lkp, pv_parts, v_elems, vp + size_t(w * pv_parts) * v_elems,
             tmp.as<uint16_t>());
    }
  });

  parallel_for(a.B * a.H * nqb, 1, [&](int64_t begin, int64_t end) {
    amx::TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.tile(t, 16, 64);
    amx::TileScope tiles(cfg);
    Aligned qbuf(size_t(qk_parts * QB * a.D) * 2), acc(size_t(QB * a.Dv) * 4), ml(size_t(QB) * 8),
        S(size_t(2 * kStrip * lds) * 4), P(size_t(2 * pv_parts * kStrip * ldp) * 2),
        prow32(size_t(KBp) * 4), add(size_t(KBp) * 4);
    uint16_t* qp[kMaxParts];
    for (int p = 0; p < qk_parts; ++p) qp[p] = qbuf.as<uint16_t>() + size_t(p * QB * a.D);
    float* m = ml.as<float>();
    float* l = m + QB;
    float* pf = prow32.as<float>();
    for (int64_t w = begin; w < end; ++w) {
      const int64_t qb_i = w % nqb, h = (w / nqb) % a.H, b = w / (nqb * a.H), hk = h / rep;
      const int64_t q0 = qb_i * QB, qn = std::min(QB, a.Lq - q0), qnp = round_up(qn, kStrip);
      for (int64_t r = 0; r < qn; ++r) {
        uint16_t* rows[kMaxParts];
        for (int p = 0; p < qk_parts; ++p) rows[p] = qp[p] + r * a.D;
        split_row(reinterpret_cast<const float*>(a.qrow(b, h, q0 + r)), a.D, qk_parts, rows);
      }
      for (int p = 0; p < qk_parts; ++p)
        std::memset(qp[p] + qn * a.D, 0, size_t((qnp - qn) * a.D) * 2);
      std::fill(m, m + qnp, kNegInf);
      std::fill(l, l + qnp, 0.f);
      std::memset(acc.p, 0, size_t(qnp * a.Dv) * 4);
      const uint16_t* kh = kp + size_t((b * a.Hkv + hk) * qk_parts) * k_elems;
      const uint16_t* vh = vp + size_t((b * a.Hkv + hk) * pv_parts) * v_elems;
      const int64_t kend = a.causal ? std::min(a.Lk, q0 + qn) : a.Lk;
      for (int64_t k0 = 0; k0 < kend; k0 += KB) {
        const int64_t kn = std::min(KB, a.Lk - k0);
        struct Strip {
          int64_t r0, rows, kvp;
          float* s;
          uint16_t* p;  // parts at p + part * kStrip * ldp
        };
        Strip strips[kQBlock / kStrip];
        int64_t n = 0;
        for (int64_t r0 = 0; r0 < qn; r0 += kStrip) {
          const int64_t rows = std::min(kStrip, qn - r0), i_last = q0 + r0 + rows - 1;
          if (a.causal && k0 > i_last) continue;
          // Causal: keys past the strip's last query are masked for all its rows.
          const int64_t kv = a.causal ? std::min(kn, i_last - k0 + 1) : kn;
          strips[n] = {r0, rows, round_up(kv, 32), S.as<float>() + (n % 2) * kStrip * lds,
                       P.as<uint16_t>() + (n % 2) * pv_parts * kStrip * ldp};
          ++n;
        }
        if (n == 0) continue;
        const uint32_t* kblk[kMaxParts];
        const uint16_t* vblk[kMaxParts];
        for (int p = 0; p < qk_parts; ++p)
          kblk[p] =
              reinterpret_cast<const uint32_t*>(kh + p * k_elems) + (k0 / 16) * (a.D / 32) * 256;
        for (int p = 0; p < pv_parts; ++p)
          vblk[p] = vh + p * v_elems + (k0 / 32) * (a.Dv / 16) * 512;
        auto set_qk = [&](SplitPump& pump, const Strip& st) {
          for (int p = 0; p < qk_parts; ++p)
            pump.q[p] = qp[p] + st.r0 * a.D, pump.kblk[p] = kblk[p];
          pump.D = a.D, pump.qk_kvp = st.kvp, pump.lds = lds, pump.s = st.s;
        };
        // Software pipeline: while the softmax of strip t runs, the pump issues P V of strip
        // t - 1 and Q K^T of strip t + 1 (S and P are double-buffered).
        SplitPump first;
        first.qk_sc = &qk_sc, first.pv_sc = &pv_sc;
        set_qk(first, strips[0]);
        first.start();
        while (first.step()) {
        }
        for (int64_t t = 0; t <= n; ++t) {
          SplitPump pump;
          pump.qk_sc = &qk_sc, pump.pv_sc = &pv_sc;
          if (t > 0) {
            const Strip& pv = strips[t - 1];
            for (int p = 0; p < pv_parts; ++p)
              pump.p[p] = pv.p + p * kStrip * ldp, pump.vblk[p] = vblk[p];
            pump.ldp = ldp, pump.pv_kvp = pv.kvp, pump.Dv = a.Dv;
            pump.acc = acc.as<float>() + pv.r0 * a.Dv;
          }
          if (t + 1 < n) set_qk(pump, strips[t + 1]);
          pump.start();
          if (t < n) {
            const Strip& cur = strips[t];
            // Spread the stage's tile steps over the softmax's vector iterations.
            const int64_t vecs = std::max<int64_t>(1, cur.rows * (kn / 16));
            const int64_t steps = std::max<int64_t>(1, pump.steps());
            const int64_t every = std::max<int64_t>(1, vecs / steps);
            const int64_t per = std::max<int64_t>(1, steps / vecs);
            int64_t tick = 0;
            auto issue = [&] {
              if (++tick == every) {
                tick = 0;
                for (int64_t i = 0; i < per; ++i) pump.step();
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
              const float alpha =
                  avx512::softmax_row<true>(cur.s + r * lds, kn, nvalid, a.scale, addp,
                                            m + cur.r0 + r, l + cur.r0 + r, pf, false, issue);
              if (cur.kvp > kn) std::memset(pf + kn, 0, size_t(cur.kvp - kn) * 4);
              uint16_t* prow[kMaxParts];
              for (int p = 0; p < pv_parts; ++p) prow[p] = cur.p + p * kStrip * ldp + r * ldp;
              split_row(pf, cur.kvp, pv_parts, prow);
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
        float* o = reinterpret_cast<float*>(a.orow(b, h, q0 + r));
        const __m512 vi = _mm512_set1_ps(inv);
        for (int64_t d = 0; d < a.Dv; d += 16)
          _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(row + d), vi));
      }
    }
  });
  return true;
}

}  // namespace tessera::cpu
