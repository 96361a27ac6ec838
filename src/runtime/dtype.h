// Element types: storage formats and the scalar conversions PyTorch uses for them.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { f32, bf16, f16, i64, i32, boolean, f8e4m3, f8e5m2 };

size_t dtype_size(DType t);
bool is_floating(DType t);
// Short name used by the CLI and error messages: "f32", "bf16", ...
const char* dtype_name(DType t);
// safetensors header names: "F32", "BF16", "F16", "I64", "I32", "BOOL", "F8_E4M3", "F8_E5M2".
const char* dtype_safetensors_name(DType t);
bool dtype_from_safetensors_name(std::string_view s, DType* out);
// Accepts "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16", ... Throws on unknown names.
DType dtype_from_name(std::string_view s);

// bf16: the top 16 bits of an f32; rounding is round-to-nearest-even, NaN stays NaN (as torch).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Round an f32 to the nearest bf16 value and back: where PyTorch stores a bf16 intermediate.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3(float f);  // saturating to +-448 as torch.float8_e4m3fn, NaN -> 0x7f
float f8e5m2_to_f32(uint8_t v);
uint8_t f32_to_f8e5m2(float f);  // round-to-nearest-even, overflow -> inf as torch.float8_e5m2

// Convert n elements between any two dtypes (contiguous buffers). Float->int truncates toward
// zero, as torch's .to(int).
void convert_elements(const void* src, DType src_t, void* dst, DType dst_t, size_t n);

}  // namespace tessera
