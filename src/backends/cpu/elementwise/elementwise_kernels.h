// Row kernels shared by the elementwise, norm and reduction ops. They work on fp32 buffers; the
// op drivers convert bf16/f16 rows to fp32 chunks and back. One table per ISA, picked at run time.
#pragma once
#include <cstdint>

#include "ops/elementwise.h"
#include "runtime/cpu_features.h"

namespace tessera {

struct EwKernels {
  CpuIsa isa;
  // o[i] = a[i*sa] op b[i*sb] with sa, sb in {0, 1} (0 broadcasts element 0).
  void (*binary)(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb, float* o,
                 int64_t n);
  // o[i] = op(x[i]). bf16_steps rounds the intermediates of composite ops (quick_gelu) to bf16
  // where the torch expression rounds them.
  void (*unary)(UnaryOp op, const float* x, float* o, int64_t n, bool bf16_steps);
  void (*bf16_to_f32)(const uint16_t* x, float* o, int64_t n);
  void (*f32_to_bf16)(const float* x, uint16_t* o, int64_t n);  // round to nearest even
  // Sums in a fixed 16-lane order, so every ISA adds in the same order.
  float (*sum)(const float* x, int64_t n);
  float (*sum_sq)(const float* x, int64_t n);
  float (*sum_sq_dev)(const float* x, float mean, int64_t n);  // sum (x - mean)^2
  // o[i] = x[i] * a + b
  void (*scale_shift)(const float* x, float a, float b, float* o, int64_t n);
  // The same binary/unary ops on bf16 rows (all operands bf16), widened in registers and
  // rounded once on store: one pass instead of convert / compute / convert.
  void (*binary_bf16)(BinaryOp op, const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb,
                      uint16_t* o, int64_t n);
  void (*unary_bf16)(UnaryOp op, const uint16_t* x, uint16_t* o, int64_t n, bool bf16_steps);
  // x[i] rounded to bf16 (nearest even) and widened back, in place: f32_to_bf16 then
  // bf16_to_f32 in one pass.
  void (*round_bf16)(float* x, int64_t n);
  // One f32 row of n <= kEwChunk elements, normalised: LayerNorm without affine (mean and biased
  // variance, double totals) and RmsNorm (times w[i] when w is not null), with the bits of the
  // sum / sum_sq_dev / sum_sq / scale_shift / binary calls that norm.cpp chains for longer rows.
  void (*layer_norm_row)(const float* x, int64_t n, float eps, float* o);
  void (*rms_norm_row)(const float* x, int64_t n, float eps, const float* w, float* o);
  // `rows` consecutive rows (row r at x + r * n and o + r * n) of the two above, with their bits.
  // An ISA file may normalise several rows at once: a row's statistics are a chain of dependent
  // adds, divides and a square root, which rows side by side overlap.
  void (*layer_norm_rows)(const float* x, int64_t rows, int64_t n, float eps, float* o);
  void (*rms_norm_rows)(const float* x, int64_t rows, int64_t n, float eps, const float* w,
                        float* o);
};

const EwKernels& ew_kernels();                // best for cpu_isa()
const EwKernels& ew_kernels_for(CpuIsa isa);  // a given path (capped to what is built)
const EwKernels& ew_kernels_scalar();
const EwKernels& ew_kernels_avx2();
const EwKernels& ew_kernels_avx512();

// n contiguous elements of dtype t at p as floats: p itself for f32, else converted into buf.
const float* ew_load(const void* p, DType t, int64_t n, float* buf);
// Stores n floats to dst as dtype t (bf16 rounds to nearest even).
void ew_store(const float* x, void* dst, DType t, int64_t n);
// Rounds floats to dtype t and back: where a torch expression stores an intermediate.
void ew_round_through(float* x, DType t, int64_t n);  // n <= kEwChunk
// Elements per chunk of the row drivers (a multiple of every vector width).
constexpr int64_t kEwChunk = 2048;

}  // namespace tessera
