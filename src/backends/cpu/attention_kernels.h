// Internal interface between the SDPA driver (attention.cpp) and its per-ISA row kernels.
#pragma once
#include <cstdint>

#include "runtime/dtype.h"

namespace tessera::cpu {

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
float softmax_row_avx512(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                         float* m, float* l, void* p, bool p_bf16);
float softmax_row_avx512bf16(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                             float* m, float* l, void* p, bool p_bf16);
// acc[0, n) *= a
void scale_row_avx512(float* acc, int64_t n, float a);
// out[0, n) = acc * inv, stored as f32 or rounded to bf16
void finish_row_avx512(const float* acc, int64_t n, float inv, void* out, bool out_bf16);

// Which implementation the CPU backend uses; tests force `reference` to check one against the
// other. `automatic` picks tiled (oneDNN tile GEMMs) unless TESSERA_CPU_ISA=scalar.
enum class AttentionPath { automatic, tiled, reference };
void set_attention_path(AttentionPath p);
AttentionPath attention_path();

}  // namespace tessera::cpu
