#include "runtime/random.h"

#include <cmath>
#include <cstring>

#include "runtime/cpu_features.h"
#include "runtime/error.h"

namespace tessera {
namespace detail {
void box_muller_mathfun_avx2(float* d, int64_t blocks, float mean, float std_);
}  // namespace detail

std::optional<ManualSeed> ManualSeed::parse(std::string_view text) {
  const bool minus = !text.empty() && text[0] == '-';
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = uint64_t(c - '0');
    if (magnitude > (UINT64_MAX - digit) / 10) return std::nullopt;  // past 2^64 - 1
    magnitude = magnitude * 10 + digit;
  }
  if (!minus || magnitude == 0) return ManualSeed{magnitude, false};
  if (magnitude > (uint64_t(1) << 63)) return std::nullopt;  // below -2^63
  return ManualSeed{0 - magnitude, true};  // two's complement, as torch's reinterpret_cast
}

std::string ManualSeed::str() const {
  if (!negative) return std::to_string(bits);
  std::string s = "-";
  s += std::to_string(0 - bits);
  return s;
}

// ---- mt19937, seeded and stepped as torch's at::mt19937 -----------------------------------

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  state_[0] = uint32_t(seed & 0xffffffffu);
  for (int j = 1; j < kN; ++j)
    state_[j] = 1812433253u * (state_[j - 1] ^ (state_[j - 1] >> 30)) + uint32_t(j);
  next_ = kN;
  has_cached_normal_ = false;
  cached_normal_ = 0.0;
}

void Generator::twist() {
  constexpr int kM = 397;
  auto step = [&](int i, int i1, int im) {
    const uint32_t y = (state_[i] & 0x80000000u) | (state_[i1] & 0x7fffffffu);
    state_[i] = state_[im] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
  };
  // Index arithmetic without modulo: the three ranges where i + 1 and i + kM wrap differently.
  int i = 0;
  for (; i < kN - kM; ++i) step(i, i + 1, i + kM);
  for (; i < kN - 1; ++i) step(i, i + 1, i + kM - kN);
  step(kN - 1, 0, kM - 1);
  next_ = 0;
}

uint32_t Generator::random() {
  if (next_ >= kN) twist();
  uint32_t y = state_[next_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t Generator::random64() {
  const uint64_t hi = random();
  const uint64_t lo = random();
  return (hi << 32) | lo;
}

double Generator::take_cached_normal() {
  has_cached_normal_ = false;
  return cached_normal_;
}

void Generator::set_cached_normal(double v) {
  has_cached_normal_ = true;
  cached_normal_ = v;
}

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// torch's uniform_real_distribution<float>(0, 1): the low 24 bits of one draw, times 2^-24.
float uniform_float(Generator& g) {
  return float(g.random() & 0xffffffu) * (1.0f / 16777216.0f);
}
// uniform_real_distribution<double>(0, 1): the low 53 bits of a 64-bit draw, times 2^-53.
double uniform_double(Generator& g) {
  return double(g.random64() & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// ---- the avx_mathfun Box-Muller, one lane at a time ---------------------------------------
// torch builds avx_mathfun.h with GCC's default -ffp-contract=fast and -mfma, so some
// mul+add pairs became FMAs; std::fma marks exactly those (verified bit for bit against torch).
// This file is compiled without -mfma, so the compiler never contracts anything itself.

float log_cephes(float x) {
  const bool invalid = !(x > 0.0f);
  x = x > from_bits(0x00800000u) ? x : from_bits(0x00800000u);
  const int32_t exponent = int32_t(bits(x) >> 23) - 0x7f;
  x = from_bits((bits(x) & ~0x7f800000u) | bits(0.5f));
  float e = float(exponent) + 1.0f;
  const bool small = x < 0.707106781186547524f;
  const float tmp = small ? x : 0.0f;
  x = x - 1.0f;
  e = e - (small ? 1.0f : 0.0f);
  x = x + tmp;
  const float z = x * x;
  float y = 7.0376836292E-2f;
  y = std::fma(y, x, -1.1514610310E-1f);
  y = std::fma(y, x, 1.1676998740E-1f);
  y = std::fma(y, x, -1.2420140846E-1f);
  y = std::fma(y, x, 1.4249322787E-1f);
  y = std::fma(y, x, -1.6668057665E-1f);
  y = std::fma(y, x, 2.0000714765E-1f);
  y = std::fma(y, x, -2.4999993993E-1f);
  y = std::fma(y, x, 3.3333331174E-1f);
  y = y * x;
  y = std::fma(y, z, e * -2.12194440e-4f);
  y = y - z * 0.5f;
  x = std::fma(e, 0.693359375f, x + y);
  return invalid ? from_bits(0xffffffffu) : x;
}

void sincos_cephes(float x, float* s, float* c) {
  uint32_t sign_sin = bits(x) & 0x80000000u;
  x = from_bits(bits(x) & 0x7fffffffu);
  int32_t j = int32_t(x * 1.27323954473516f);  // cvtt: truncation
  j = (j + 1) & ~1;
  const float y0 = float(j);
  const uint32_t swap_sin = uint32_t(j & 4) << 29;
  const bool poly_cos = (j & 2) == 0;
  x = std::fma(y0, -0.78515625f, x);
  x = std::fma(y0, -2.4187564849853515625e-4f, x);
  x = std::fma(y0, -3.77489497744594108e-8f, x);
  const uint32_t sign_cos = uint32_t(~(j - 2) & 4) << 29;
  sign_sin ^= swap_sin;

  const float z = x * x;
  float y = 2.443315711809948E-005f;
  y = std::fma(y, z, -1.388731625493765E-003f);
  y = std::fma(y, z, 4.166664568298827E-002f);
  y = y * z;
  y = std::fma(y, z, -(z * 0.5f));
  y = y + 1.0f;

  float y2 = -1.9515295891E-4f;
  y2 = std::fma(y2, z, 8.3321608736E-3f);
  y2 = std::fma(y2, z, -1.6666654611E-1f);
  y2 = y2 * z;
  y2 = std::fma(y2, x, x);

  // Same select-by-subtraction as the vector code, so signed zeros come out alike.
  const float ysin2 = poly_cos ? y2 : 0.0f;
  const float ysin1 = poly_cos ? 0.0f : y;
  y2 = y2 - ysin2;
  y = y - ysin1;
  *s = from_bits(bits(ysin1 + ysin2) ^ sign_sin);
  *c = from_bits(bits(y + y2) ^ sign_cos);
}

constexpr float kTwoPiF = float(2.0 * 3.14159265358979323846);

// Box-Muller on 16 uniforms in place: outputs j use (1 - d[j], d[j + 8]); cos term to j, sin
// term to j + 8.
void box_muller16_mathfun(float* d, float mean, float std_) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - d[j];
    const float u2 = d[j + 8];
    const float radius = std::sqrt(-2.0f * log_cephes(u1));
    float s, c;
    sincos_cephes(kTwoPiF * u2, &s, &c);
    d[j] = std::fma(radius * c, std_, mean);
    d[j + 8] = std::fma(radius * s, std_, mean);
  }
}

// torch's scalar NormalFill16 (DEFAULT capability): libm logf/cosf/sinf, theta in double.
void box_muller16_libm(float* d, float mean, float std_) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - d[j];
    const float u2 = d[j + 8];
    const float radius = std::sqrt(-2.0f * std::log(u1));
    const float theta = float(2.0 * 3.14159265358979323846 * double(u2));
    d[j] = std::fma(radius * std::cos(theta), std_, mean);
    d[j + 8] = std::fma(radius * std::sin(theta), std_, mean);
  }
}

void store(void* out, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::f32:
      static_cast<float*>(out)[i] = v;
      break;
    case DType::bf16:
      static_cast<uint16_t*>(out)[i] = f32_to_bf16(v);
      break;
    case DType::f16:
      static_cast<uint16_t*>(out)[i] = f32_to_f16(v);
      break;
    default:
      TESSERA_FAIL("[random] unsupported dtype ", dtype_name(dt));
  }
}

void check_dtype(const char* op, DType dt) {
  TESSERA_CHECK(dt == DType::f32 || dt == DType::bf16 || dt == DType::f16, "[", op, "] dtype ",
                dtype_name(dt), " is not supported; expected f32, bf16 or f16");
}

// Box-Muller over `blocks` consecutive groups of 16 uniforms, with the generator's kernel.
void box_muller_blocks(float* d, int64_t blocks, float mean, float std_, NormalKernel kernel) {
  if (kernel == NormalKernel::avx_mathfun && cpu_isa() >= CpuIsa::avx2) {
    detail::box_muller_mathfun_avx2(d, blocks, mean, std_);
    return;
  }
  auto one = kernel == NormalKernel::avx_mathfun ? box_muller16_mathfun : box_muller16_libm;
  for (int64_t b = 0; b < blocks; ++b) one(d + 16 * b, mean, std_);
}

// torch's normal_fill: numel >= 16, contiguous output.
void normal_fill(void* out, DType dt, int64_t n, float mean, float std_, Generator& g) {
  const NormalKernel kernel = g.normal_kernel();
  if (dt == DType::f32) {
    // f32: all n uniforms first, then blocks in place; a ragged end redraws its last 16.
    float* d = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) d[i] = uniform_float(g);
    box_muller_blocks(d, n / 16, mean, std_, kernel);
    if (n % 16 != 0) {
      float* tail = d + n - 16;
      for (int i = 0; i < 16; ++i) tail[i] = uniform_float(g);
      box_muller_blocks(tail, 1, mean, std_, kernel);
    }
    return;
  }
  // Reduced precision: 16 float uniforms per block into a buffer, rounded on store.
  float buf[16];
  auto block = [&](int64_t at) {
    for (int i = 0; i < 16; ++i) buf[i] = uniform_float(g);
    box_muller_blocks(buf, 1, mean, std_, kernel);
    uint16_t* o = static_cast<uint16_t*>(out) + at;
    if (dt == DType::bf16) {
      for (int i = 0; i < 16; ++i) o[i] = f32_to_bf16(buf[i]);
    } else {
      for (int i = 0; i < 16; ++i) o[i] = f32_to_f16(buf[i]);
    }
  };
  for (int64_t i = 0; i + 16 <= n; i += 16) block(i);
  if (n % 16 != 0) block(n - 16);
}

// torch's normal_distribution<double>, one value per element; pairs share the cached sample.
double normal_double(Generator& g, double mean, double std_) {
  if (g.has_cached_normal()) return g.take_cached_normal() * std_ + mean;
  const double u1 = uniform_double(g);
  const double u2 = uniform_double(g);
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * 3.14159265358979323846 * u1;
  g.set_cached_normal(r * std::sin(theta));
  return r * std::cos(theta) * std_ + mean;
}

}  // namespace

Tensor normal(const Shape& shape, double mean, double std_, DType dtype, Generator& gen) {
  check_dtype("normal", dtype);
  TESSERA_CHECK(std_ >= 0.0, "[normal] std must be >= 0, got ", std_);
  Tensor out = Tensor::empty(shape, dtype);
  const int64_t n = out.numel();
  void* data = out.raw_data();
  if (n >= 16) {
    normal_fill(data, dtype, n, float(mean), float(std_), gen);
  } else {
    // Casts go double -> float -> dtype, as torch's static_cast<scalar_t>(double).
    for (int64_t i = 0; i < n; ++i) store(data, dtype, i, float(normal_double(gen, mean, std_)));
  }
  return out;
}

Tensor randn(const Shape& shape, DType dtype, Generator& gen) {
  check_dtype("randn", dtype);
  return normal(shape, 0.0, 1.0, dtype, gen);
}

Tensor rand(const Shape& shape, DType dtype, Generator& gen) {
  check_dtype("rand", dtype);
  Tensor out = Tensor::empty(shape, dtype);
  const int64_t n = out.numel();
  void* data = out.raw_data();
  for (int64_t i = 0; i < n; ++i) {
    const float u = uniform_float(gen);
    store(data, dtype, i, u);
    // A value that rounds up to 1 in the narrow dtype wraps to 0, keeping [0, 1).
    if (dtype != DType::f32) {
      const uint16_t one = dtype == DType::bf16 ? f32_to_bf16(1.0f) : f32_to_f16(1.0f);
      uint16_t* p = static_cast<uint16_t*>(data) + i;
      if (*p == one) *p = 0;
    }
  }
  return out;
}

}  // namespace tessera
