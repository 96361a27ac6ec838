// torch-compatible CPU random numbers: Generator(seed) reproduces
// torch.Generator("cpu").manual_seed(seed), and randn/rand reproduce torch.randn/torch.rand
// with that generator bit for bit (see docs/decisions/0004-torch-rng.md).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/tensor.h"

namespace tessera {

// Which Box-Muller kernel torch's CPU normal_ runs on blocks of 16 floats. torch picks it by
// its CPU capability: AVX2 and AVX512 builds use the Cephes-style avx_mathfun polynomials, the
// DEFAULT build (no AVX2, or ATEN_CPU_CAPABILITY=default) calls libm logf/cosf/sinf.
enum class NormalKernel { avx_mathfun, libm };

// An argument torch.Generator.manual_seed accepts: an integer in [-2^63, 2^64 - 1]. torch
// raises on anything else, and seeds a negative one as its two's complement, seed + 2^64.
struct ManualSeed {
  static constexpr const char* kRange = "[-9223372036854775808, 18446744073709551615]";
  uint64_t bits = 0;      // what the generator is seeded with
  bool negative = false;  // the integer given is bits - 2^64
  // Decimal text ("42", "-1", "+7", "007"); nullopt if it is not an integer in the range.
  static std::optional<ManualSeed> parse(std::string_view text);
  std::string str() const;  // the integer given, in decimal
};

// Not thread-safe: one generator per thread, or serialise draws (torch takes a mutex).
class Generator {
 public:
  // torch's default CPU seed (c10::default_rng_seed_val).
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;

  explicit Generator(uint64_t seed = kDefaultSeed) { manual_seed(seed); }

  // Reseeds mt19937 from the low 32 bits (as torch) and drops the cached normal sample.
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const { return seed_; }

  // One mt19937 output; random64 takes two, the first in the high half (as torch).
  uint32_t random();
  uint64_t random64();

  // The second Box-Muller value of torch's double normal path, kept for the next draw.
  bool has_cached_normal() const { return has_cached_normal_; }
  double take_cached_normal();
  void set_cached_normal(double v);

  NormalKernel normal_kernel() const { return kernel_; }
  // Default avx_mathfun (torch on any x86 CPU with AVX2); libm matches torch's DEFAULT build.
  void set_normal_kernel(NormalKernel k) { kernel_ = k; }

 private:
  void twist();

  static constexpr int kN = 624;
  std::array<uint32_t, kN> state_{};
  int next_ = 0;  // index of the next word to temper; kN means "twist first"
  uint64_t seed_ = 0;
  bool has_cached_normal_ = false;
  double cached_normal_ = 0.0;
  NormalKernel kernel_ = NormalKernel::avx_mathfun;
};

// torch.randn(shape, generator=gen, dtype=dtype) on CPU; dtype f32, bf16 or f16.
Tensor randn(const Shape& shape, DType dtype, Generator& gen);
// torch.empty(shape, dtype).normal_(mean, std, generator=gen).
Tensor normal(const Shape& shape, double mean, double std, DType dtype, Generator& gen);
// torch.rand(shape, generator=gen, dtype=dtype): uniform [0, 1); dtype f32, bf16 or f16.
Tensor rand(const Shape& shape, DType dtype, Generator& gen);

}  // namespace tessera
