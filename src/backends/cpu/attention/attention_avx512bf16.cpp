// The softmax row kernel with AVX512-BF16's native f32 -> bf16 conversion for the probabilities.
#include "backends/cpu/attention/attention_row_avx512.h"

namespace tessera::cpu {

float softmax_row_avx512bf16(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                             float* m, float* l, void* p, bool p_bf16) {
  return avx512::softmax_row<true>(s, n, nvalid, scale, add, m, l, p, p_bf16);
}

}  // namespace tessera::cpu
