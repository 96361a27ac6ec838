// torch-compatible RNG: bit-for-bit against tests/fixtures/rng (reference/goldens/rng.py).
#include "runtime/random.h"

#include <cstring>
#include <sstream>

#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::bit_equal;

DType dtype_of(const std::string& key) {
  const std::string tag = key.substr(key.rfind('_') + 1);
  return dtype_from_name(tag);
}

// Parses "s<seed>_<d0>x<d1>..._<dtype>" (the key format of rng.py).
void parse_key(const std::string& key, uint64_t* seed, Shape* shape, DType* dt) {
  const size_t a = key.find('_'), b = key.rfind('_');
  *seed = std::stoull(key.substr(1, a - 1));
  shape->clear();
  std::stringstream dims(key.substr(a + 1, b - a - 1));
  for (std::string d; std::getline(dims, d, 'x');) shape->push_back(std::stoll(d));
  *dt = dtype_from_name(key.substr(b + 1));
}

int64_t fnv1a64(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  int64_t r;
  std::memcpy(&r, &h, 8);
  return r;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

#define REQUIRE_FIXTURE(f)   \
  if (!test::has_fixture(f)) \
  GTEST_SKIP() << "missing fixture " << f << " (run reference/make_fixtures.py --only rng)"

// Every full tensor in a fixture file, regenerated from its seed.
void check_full_keys(const std::string& file, NormalKernel kernel) {
  for (const auto& [key, expected] : test::load_fixture(file)) {
    uint64_t seed;
    Shape shape;
    DType dt;
    parse_key(key, &seed, &shape, &dt);
    Generator g(seed);
    g.set_normal_kernel(kernel);
    EXPECT_TRUE(bit_equal(randn(shape, dt, g), expected)) << file << ": " << key;
  }
}

TEST(Random, Mt19937MatchesReferenceSequence) {
  // std::mt19937 with the same 32-bit seed yields the same stream: 10000th output for 5489.
  Generator g(5489);
  uint32_t v = 0;
  for (int i = 0; i < 10000; ++i) v = g.random();
  EXPECT_EQ(v, 4123659995u);
}

TEST(Random, RandnSmallAndOddSizes) {
  REQUIRE_FIXTURE("rng/randn.safetensors");
  int checked = 0;
  for (const auto& [key, expected] : test::load_fixture("rng/randn.safetensors")) {
    if (key.find("__") != std::string::npos) continue;
    uint64_t seed;
    Shape shape;
    DType dt;
    parse_key(key, &seed, &shape, &dt);
    Generator g(seed);
    EXPECT_TRUE(bit_equal(randn(shape, dt, g), expected)) << key;
    ++checked;
  }
  EXPECT_EQ(checked, 3 * 3 * 7);
}

TEST(Random, RandnLargeShapesAllSeeds) {
  REQUIRE_FIXTURE("rng/randn.safetensors");
  const auto fx = test::load_fixture("rng/randn.safetensors");
  int checked = 0;
  for (const auto& [key, hash] : fx) {
    if (!ends_with(key, "__fnv")) continue;
    const std::string base = key.substr(0, key.size() - 5);
    uint64_t seed;
    Shape shape;
    DType dt;
    parse_key(base, &seed, &shape, &dt);
    Generator g(seed);
    const Tensor flat = randn(shape, dt, g).flatten();
    const int64_t n = flat.numel();
    EXPECT_TRUE(bit_equal(flat.slice(0, 0, 512), fx.at(base + "__head"))) << base;
    EXPECT_TRUE(bit_equal(flat.slice(0, n - 512, n), fx.at(base + "__tail"))) << base;
    EXPECT_TRUE(bit_equal(flat.slice(0, 0, n, 251), fx.at(base + "__stride"))) << base;
    EXPECT_EQ(fnv1a64(flat), hash.data<int64_t>()[0]) << base << ": bytes differ from torch";
    ++checked;
  }
  EXPECT_EQ(checked, 3 * 2 * 2);
}

TEST(Random, RandnFullLatent) {
  REQUIRE_FIXTURE("rng/randn_full.safetensors");
  check_full_keys("rng/randn_full.safetensors", NormalKernel::avx_mathfun);
}

TEST(Random, RandnScalarKernelMatchesTorchDefaultCapability) {
  REQUIRE_FIXTURE("rng/randn_scalar.safetensors");
  check_full_keys("rng/randn_scalar.safetensors", NormalKernel::libm);
}

TEST(Random, SuccessiveDrawsAdvanceLikeTorch) {
  REQUIRE_FIXTURE("rng/sequences.safetensors");
  const auto fx = test::load_fixture("rng/sequences.safetensors");
  size_t checked = 0;
  for (int i = 0;; ++i) {
    const std::string prefix = "seq" + std::to_string(i) + "_";
    if (fx.lower_bound(prefix) == fx.end() || fx.lower_bound(prefix)->first.rfind(prefix, 0) != 0)
      break;
    Generator g(42);
    for (int j = 0;; ++j) {
      auto it = fx.lower_bound(prefix + std::to_string(j) + "_");
      if (it == fx.end() || it->first.rfind(prefix + std::to_string(j) + "_", 0) != 0) break;
      const Tensor& expected = it->second;
      EXPECT_TRUE(bit_equal(randn(expected.shape(), dtype_of(it->first), g), expected))
          << it->first;
      ++checked;
    }
  }
  EXPECT_EQ(checked, fx.size());
}

TEST(Random, RandUniform) {
  REQUIRE_FIXTURE("rng/rand.safetensors");
  const auto fx = test::load_fixture("rng/rand.safetensors");
  for (const auto& [key, expected] : fx) {
    if (key.rfind("s0_", 0) != 0) continue;
    Generator g(0);
    EXPECT_TRUE(bit_equal(rand(expected.shape(), dtype_of(key), g), expected)) << key;
  }
  Generator g(1);
  EXPECT_TRUE(bit_equal(rand({7}, DType::f32, g), fx.at("mix_0_f32")));
  EXPECT_TRUE(bit_equal(randn({3}, DType::f32, g), fx.at("mix_1_f32")));
  EXPECT_TRUE(bit_equal(rand({5}, DType::f32, g), fx.at("mix_2_f32")));
  EXPECT_TRUE(bit_equal(randn({18}, DType::f32, g), fx.at("mix_3_f32")));
}

TEST(Random, NormalWithMeanAndStd) {
  REQUIRE_FIXTURE("rng/normal.safetensors");
  for (const auto& [key, expected] : test::load_fixture("rng/normal.safetensors")) {
    Generator g(3);
    EXPECT_TRUE(bit_equal(normal(expected.shape(), 0.3, 2.5, dtype_of(key), g), expected)) << key;
  }
}

TEST(Random, ManualSeedResets) {
  Generator g(7);
  const Tensor a = randn({3}, DType::f32, g);  // leaves a cached normal sample
  g.manual_seed(7);
  EXPECT_FALSE(g.has_cached_normal());
  EXPECT_TRUE(bit_equal(randn({3}, DType::f32, g), a));
}

// torch.Generator.manual_seed takes integers in [-2^63, 2^64 - 1] (it unpacks a uint64, and on
// overflow an int64 reinterpreted as uint64) and raises on anything else.
TEST(Random, ManualSeedAcceptsTorchsRange) {
  struct Case {
    const char* text;
    uint64_t bits;
    bool negative;
    const char* str;
  };
  for (const Case& c : {Case{"0", 0, false, "0"},
                        Case{"42", 42, false, "42"},
                        Case{"+7", 7, false, "7"},
                        Case{"007", 7, false, "7"},
                        Case{"-0", 0, false, "0"},
                        Case{"-1", UINT64_MAX, true, "-1"},
                        Case{"-42", UINT64_MAX - 41, true, "-42"},
                        Case{"18446744073709551615", UINT64_MAX, false, "18446744073709551615"},
                        Case{"9223372036854775808", 1ull << 63, false, "9223372036854775808"},
                        Case{"-9223372036854775808", 1ull << 63, true, "-9223372036854775808"}}) {
    SCOPED_TRACE(c.text);
    const auto s = ManualSeed::parse(c.text);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->bits, c.bits);
    EXPECT_EQ(s->negative, c.negative);
    EXPECT_EQ(s->str(), c.str);
  }
  for (const char* bad : {"", "-", "+", "--1", "+-1", "18446744073709551616", "-9223372036854775809",
                          "99999999999999999999999", "-99999999999999999999999", "1.5", "1e3",
                          " 1", "1 ", "0x10", "abc", "1_000"})
    EXPECT_FALSE(ManualSeed::parse(bad)) << bad;
  // A negative seed draws what its two's complement draws.
  Generator a(ManualSeed::parse("-1")->bits), b(UINT64_MAX);
  EXPECT_TRUE(bit_equal(randn({5}, DType::f32, a), randn({5}, DType::f32, b)));
}

TEST(Random, RejectsIntegerDtype) {
  Generator g(0);
  EXPECT_THROW(randn({4}, DType::i32, g), Error);
  EXPECT_THROW(rand({4}, DType::i64, g), Error);
}

}  // namespace
}  // namespace tessera
