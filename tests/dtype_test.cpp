// dtype conversions bit for bit against torch's Tensor.to() (reference/goldens/dtypes.py).
// NaN payloads are not compared: torch itself gives different NaN bits on its vectorised and
// scalar paths (bf16: 0xffff vs 0x7fc0), so a NaN input only has to stay NaN.
#include "runtime/dtype.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace tessera {
namespace {

const char* kFile = "dtypes/conversions.safetensors";

#define REQUIRE_FIXTURE()        \
  if (!test::has_fixture(kFile)) \
  GTEST_SKIP() << "missing fixture " << kFile << " (run reference/make_fixtures.py --only dtypes)"

// Raw element codes of a tensor (contiguous fixture tensors), widened to 64 bits.
std::vector<uint64_t> codes(const void* p, DType t, size_t n) {
  std::vector<uint64_t> out(n);
  const size_t w = dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, static_cast<const uint8_t*>(p) + i * w, w);
    out[i] = v;
  }
  return out;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

bool is_nan_code(uint64_t c, DType t) {
  switch (t) {
    case DType::f32:
      return (c & 0x7fffffffu) > 0x7f800000u;
    case DType::bf16:
      return (c & 0x7fffu) > 0x7f80u;
    case DType::f16:
      return (c & 0x7fffu) > 0x7c00u;
    case DType::f8e4m3:
      return (c & 0x7fu) == 0x7fu;
    case DType::f8e5m2:
      return (c & 0x7fu) > 0x7cu;
    default:
      return false;
  }
}

// Converts n source elements with convert_elements and compares codes with torch's.
::testing::AssertionResult converts_like_torch(const void* src, DType st, size_t n,
                                               const Tensor& expected) {
  if (size_t(expected.numel()) != n)
    return ::testing::AssertionFailure() << "golden has " << expected.numel() << " elements, "
                                         << "expected " << n;
  const DType dt = expected.dtype();
  std::vector<uint8_t> dst(n * dtype_size(dt));
  convert_elements(src, st, dst.data(), dt, n);
  const auto got = codes(dst.data(), dt, n), want = codes(expected.raw_data(), dt, n);
  const auto in = codes(src, st, n);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool ok = is_nan_code(in[i], st) || is_nan_code(want[i], dt)
                        ? is_nan_code(got[i], dt) == is_nan_code(want[i], dt)
                        : got[i] == want[i];
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " " << dtype_name(st) << " -> " << dtype_name(dt)
         << " conversions differ; first at " << first << ": source code " << hex(in[first])
         << " gave " << hex(got[first]) << ", torch " << hex(want[first]);
}

// Every code of a k-bit format in order 0 .. 2^k - 1, as the goldens enumerate them.
std::vector<uint8_t> all_codes(DType t) {
  const size_t n = size_t(1) << (8 * dtype_size(t));
  std::vector<uint8_t> out(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) std::memcpy(&out[i * dtype_size(t)], &i, dtype_size(t));
  return out;
}

TEST(DType, F32ToNarrowFormats) {
  REQUIRE_FIXTURE();
  const auto fx = test::load_fixture(kFile);
  const Tensor& src = fx.at("src_f32");
  for (const char* key : {"f32_to_bf16", "f32_to_f16", "f32_to_f8e4m3", "f32_to_f8e5m2"}) {
    EXPECT_TRUE(converts_like_torch(src.raw_data(), DType::f32, src.numel(), fx.at(key))) << key;
  }
}

TEST(DType, EveryNarrowCodeToF32) {
  REQUIRE_FIXTURE();
  const auto fx = test::load_fixture(kFile);
  for (DType t : {DType::f16, DType::f8e4m3, DType::f8e5m2}) {
    const auto src = all_codes(t);
    const std::string key = std::string("all_") + dtype_name(t) + "_to_f32";
    EXPECT_TRUE(converts_like_torch(src.data(), t, src.size() / dtype_size(t), fx.at(key))) << key;
  }
}

TEST(DType, NarrowToNarrow) {
  REQUIRE_FIXTURE();
  const auto fx = test::load_fixture(kFile);
  const auto f16 = all_codes(DType::f16), bf16 = all_codes(DType::bf16);
  EXPECT_TRUE(converts_like_torch(bf16.data(), DType::bf16, 65536, fx.at("all_bf16_to_f16")));
  EXPECT_TRUE(converts_like_torch(f16.data(), DType::f16, 65536, fx.at("all_f16_to_bf16")));
  EXPECT_TRUE(converts_like_torch(f16.data(), DType::f16, 65536, fx.at("all_f16_to_f8e4m3")));
  EXPECT_TRUE(converts_like_torch(bf16.data(), DType::bf16, 65536, fx.at("all_bf16_to_f8e5m2")));
}

TEST(DType, IntegerConversions) {
  REQUIRE_FIXTURE();
  const auto fx = test::load_fixture(kFile);
  const Tensor& f = fx.at("int_src_f32");
  EXPECT_TRUE(converts_like_torch(f.raw_data(), DType::f32, f.numel(), fx.at("f32_to_i32")));
  EXPECT_TRUE(converts_like_torch(f.raw_data(), DType::f32, f.numel(), fx.at("f32_to_i64")));
  const Tensor& i = fx.at("i64_src");
  for (const char* key : {"i64_to_f32", "i64_to_bf16", "i64_to_f16"})
    EXPECT_TRUE(converts_like_torch(i.raw_data(), DType::i64, i.numel(), fx.at(key))) << key;
}

// The scalar helpers models call directly must agree with convert_elements.
TEST(DType, ScalarHelpersMatchGolden) {
  REQUIRE_FIXTURE();
  const auto fx = test::load_fixture(kFile);
  const Tensor& src = fx.at("src_f32");
  const float* x = src.data<float>();
  const auto* bf = fx.at("f32_to_bf16").data<uint16_t>();
  const auto* h = fx.at("f32_to_f16").data<uint16_t>();
  for (int64_t k = 0; k < src.numel(); ++k) {
    if (std::isnan(x[k])) continue;
    ASSERT_EQ(f32_to_bf16(x[k]), bf[k]) << "at " << k << " value " << x[k];
    ASSERT_EQ(f32_to_f16(x[k]), h[k]) << "at " << k << " value " << x[k];
    const float r = round_bf16(x[k]), e = bf16_to_f32(bf[k]);
    ASSERT_EQ(std::memcmp(&r, &e, 4), 0) << "round_bf16 at " << k;
  }
}

// convert_elements' vectorised bf16 <-> f32 loops give the scalar helpers' bits: every bf16 code,
// and f32 patterns around every rounding tie, NaNs (quieted) and infinities.
TEST(DType, Bf16F32FastPathsMatchScalarHelpers) {
  std::vector<uint16_t> all(65536);
  for (uint32_t c = 0; c < 65536; ++c) all[c] = uint16_t(c);
  std::vector<float> wide(all.size());
  convert_elements(all.data(), DType::bf16, wide.data(), DType::f32, all.size());
  for (uint32_t c = 0; c < 65536; ++c) {
    const float e = bf16_to_f32(uint16_t(c));
    ASSERT_EQ(std::memcmp(&wide[c], &e, 4), 0) << "bf16 code " << c;
  }
  std::vector<float> f;
  for (uint32_t hi = 0; hi < 65536; hi += 7)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const uint32_t u = (hi << 16) | lo;
      float v;
      std::memcpy(&v, &u, 4);
      f.push_back(v);
    }
  std::vector<uint16_t> narrow(f.size());
  convert_elements(f.data(), DType::f32, narrow.data(), DType::bf16, f.size());
  for (size_t k = 0; k < f.size(); ++k) ASSERT_EQ(narrow[k], f32_to_bf16(f[k])) << "at " << k;
}

}  // namespace
}  // namespace tessera
