// Internal interface between the SDPA driver (attention.cpp) and its per-ISA row kernels.
#pragma once
#include <cmath>
#include <cstdint>

#include "backends/cpu/gemm/gemm_small.h"
#include "runtime/dtype.h"
#include "runtime/parallel.h"

namespace tessera::cpu {

// One SDPA call as the kernels see it.
struct SdpaArgs {
  bool bf16;
  int64_t B, H, Hkv, Lq, Lk, D, Dv;
  const char *q, *k, *v;
  int64_t qs[3], ks[3], vs[3];  // element strides of batch, head, position; last dim stride 1
  char* out;                    // contiguous (B, H, Lq, Dv)
  const char* mask = nullptr;   // expanded (B, H, Lq, Lk) view
  DType mask_dtype = DType::f32;
  int64_t ms[4] = {0, 0, 0, 0};
  bool causal;
  float scale;
  bool round_p_bf16 = false;  // f32 operands standing in for bf16 ones: round P to bf16 values
  size_t es() const { return bf16 ? 2 : 4; }
  const char* qrow(int64_t b, int64_t h, int64_t i) const {
    return q + (b * qs[0] + h * qs[1] + i * qs[2]) * int64_t(es());
  }
  const char* krow(int64_t b, int64_t h, int64_t j) const {
    return k + (b * ks[0] + h * ks[1] + j * ks[2]) * int64_t(es());
  }
  const char* vrow(int64_t b, int64_t h, int64_t j) const {
    return v + (b * vs[0] + h * vs[1] + j * vs[2]) * int64_t(es());
  }
  char* orow(int64_t b, int64_t h, int64_t i) const {
    return out + ((b * H + h) * Lq + i) * Dv * int64_t(es());
  }
};

// Grain for a parallel_for over (batch, head, q-block) tasks of QB query rows: one thread for
// attentions with less than min_parallel_work() multiply-adds in all.
inline int64_t sdpa_task_grain(const SdpaArgs& a, int64_t QB) {
  return grain_for_work(QB * a.Lk * (a.D + a.Dv));
}

// Mask row (b, h, i), columns [j0, j0 + n), as additive floats (-inf where a bool mask is false).
void sdpa_mask_row(const SdpaArgs& a, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                   float* add);

// The AMX tile kernel (attention_amx.cpp): bf16 only, D and Dv multiples of 32. Returns false,
// having done nothing, when it does not cover the call.
bool sdpa_amx(const SdpaArgs& a);

// The f32 AMX kernel (attention_f32_amx.cpp): f32 operands split into bf16 parts, each product a
// sum of 3, 4 or 6 bf16 tile products, chosen separately for Q K^T and P V
// (TESSERA_SDPA_F32_PRODUCTS=qk[,pv], or set_sdpa_f32_products for tests; 0, 0 restores the
// defaults). Same coverage and fallback contract as sdpa_amx.
constexpr int kSdpaF32QkProducts = 6, kSdpaF32PvProducts = 6;
bool sdpa_amx_f32(const SdpaArgs& a);
void set_sdpa_f32_products(int qk, int pv);

// exp as PyTorch's CPU flash attention evaluates it, so that bf16 probabilities round the same
// way: a degree-5 polynomial ("exp_u20", ~20 ulp) on each full 16-lane vector of a key block,
// libm expf on the remainder. Keys are processed in blocks of kSdpaKeyBlock like torch.
constexpr int64_t kSdpaKeyBlock = 512;
float exp_u20_scalar(float x);

// One online-softmax step on a row of raw scores s[0, n): x = s * scale + add (add may be null;
// x overwrites s), columns >= nvalid count as -inf. Updates the running max *m and sum *l, writes
// exp(x - m_new) to p (f32, or bf16 rounded like torch's reduced-precision flash kernel) and
// returns the factor exp(m_old - m_new) by which the row's accumulator must be rescaled.
using SoftmaxRowFn = float (*)(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                               float* m, float* l, void* p, bool p_bf16);

float softmax_row_scalar(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                         float* m, float* l, void* p, bool p_bf16);
float softmax_row_avx2(float* s, int64_t n, int64_t nvalid, float scale, const float* add, float* m,
                       float* l, void* p, bool p_bf16);
float softmax_row_avx512(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                         float* m, float* l, void* p, bool p_bf16);
float softmax_row_avx512bf16(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                             float* m, float* l, void* p, bool p_bf16);
// Whether f32 tile products run on gemm_small.h's kernel in eager SDPA (AVX2 CPUs: oneDNN's AVX2
// tiles sum some rows of a tile in another order, so the prepared SDPA could not match them bit
// for bit) for head dim D and key blocks of KB. The prepared SDPA then does the same.
bool sdpa_tiles_on_small_gemm(int64_t D, int64_t KB);
// The tile products: S (qn x kn, row stride ld) = Q rows x KT (D x kn, row stride ld, the keys
// transposed); acc (qn x Dv) += P (qn x kn, row stride ld) x V rows.
SmallGemm sdpa_qk_tile(const SdpaArgs& a, const char* q, int64_t qn, int64_t kn, const float* kt,
                       int64_t ld, float* s);
SmallGemm sdpa_pv_tile(const SdpaArgs& a, const float* p, int64_t ld, const char* v, int64_t qn,
                       int64_t kn, float* acc);
// The row kernel for this CPU (cpu_isa()): AVX-512-BF16, AVX-512, AVX2 or scalar.
SoftmaxRowFn softmax_row_for_cpu();
// acc[0, n) *= a
void scale_row_avx512(float* acc, int64_t n, float a);
// out[0, n) = acc * inv, stored as f32 or rounded to bf16
void finish_row_avx512(const float* acc, int64_t n, float inv, void* out, bool out_bf16);

// The tiled paths' row steps on whichever ISA the caller chose (avx512: the kernels above, else
// scalar loops with the same roundings).
inline void scale_row(float* acc, int64_t n, float a, bool avx512) {
  if (avx512) return scale_row_avx512(acc, n, a);
  for (int64_t d = 0; d < n; ++d) acc[d] *= a;
}
// The output row acc / l: 0 for a fully masked row (l == 0), as torch.
inline void finish_row(const float* acc, int64_t n, float l, void* out, bool out_bf16,
                       bool avx512) {
  const float inv = l > 0 ? 1.f / l : 0.f;
  if (avx512) return finish_row_avx512(acc, n, inv, out, out_bf16);
  for (int64_t d = 0; d < n; ++d) {
    const float x = acc[d] * inv;
    if (out_bf16)
      static_cast<uint16_t*>(out)[d] = f32_to_bf16(x);
    else
      static_cast<float*>(out)[d] = x;
  }
}

// The vector rows' scalar tail, columns [from, n) past the last whole 16-score vector: torch
// uses libm expf there. Writes P and returns the tail's sum.
inline float softmax_row_tail(const float* s, int64_t from, int64_t n, int64_t nvalid,
                              bool prescaled, float scale, float mx, void* p, bool p_bf16) {
  float sum = 0.f;
  for (int64_t j = from; j < n; ++j) {
    const float x = prescaled ? s[j] : s[j] * scale;
    const float e = j < nvalid ? std::exp(x - mx) : 0.f;
    sum += e;
    if (p_bf16)
      static_cast<uint16_t*>(p)[j] = f32_to_bf16(e);
    else
      static_cast<float*>(p)[j] = e;
  }
  return sum;
}

// A bf16 call run on f32 tiles where oneDNN has no bf16 tile GEMM: `a` for contiguous f32 copies
// of Q, K and V ((B, H, L, D) rows), P rounded to bf16 values; the data pointers are the caller's.
inline SdpaArgs bf16_call_on_f32(const SdpaArgs& a) {
  SdpaArgs f = a;
  f.bf16 = false;
  f.round_p_bf16 = true;
  const int64_t qs[3] = {a.H * a.Lq * a.D, a.Lq * a.D, a.D},
                ks[3] = {a.Hkv * a.Lk * a.D, a.Lk * a.D, a.D},
                vs[3] = {a.Hkv * a.Lk * a.Dv, a.Lk * a.Dv, a.Dv};
  for (int i = 0; i < 3; ++i) f.qs[i] = qs[i], f.ks[i] = ks[i], f.vs[i] = vs[i];
  return f;
}

// SdpaArgs::round_p_bf16: P rounded to the values the bf16 kernel feeds to P V.
inline void round_row_bf16(float* p, int64_t n) {
  for (int64_t j = 0; j < n; ++j) p[j] = round_bf16(p[j]);
}

// Which implementation the CPU backend uses; tests force one to check it against another.
// `automatic` picks amx (our own AMX tile kernels, bf16 and split-f32) when the CPU has AMX and
// the head dims are multiples of 32, else tiled (oneDNN tile GEMMs), and reference under
// TESSERA_CPU_ISA=scalar. A forced `amx` falls back to `tiled` for what it does not cover.
enum class AttentionPath { automatic, tiled, reference, amx };
void set_attention_path(AttentionPath p);
AttentionPath attention_path();

}  // namespace tessera::cpu
