// conv2d against PyTorch goldens (reference/goldens/ops_linalg.py) and its error messages.
#include "ops/conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ops/copy.h"
#include "ops/linalg.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

::testing::AssertionResult close_to_torch(const Tensor& actual, const Tensor& expected) {
  if (expected.dtype() == DType::bf16) return test::bf16_close(actual, expected);
  float scale = 0;
  for (float v : expected.to_floats()) scale = std::max(scale, std::fabs(v));
  return test::all_close(actual, expected, 1e-5, 1e-5 * std::max(1.0f, scale));
}

class ConvFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(ConvFixture, MatchesTorch) {
  const std::string file = std::string("ops/conv/conv2d_") + GetParam() + ".safetensors";
  if (!test::has_fixture(file)) GTEST_SKIP() << "missing fixture " << file;
  auto f = test::load_fixture(file);
  const Tensor x = f.at("x");
  struct Case {
    const char* name;
    int64_t stride, pad;
  };
  for (const Case c :
       {Case{"k3s1p1", 1, 1}, Case{"k3s2p1", 2, 1}, Case{"k1s1p0", 1, 0}, Case{"k3s2p0", 2, 0}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor w = f.at(n + ".w"), b = f.at(n + ".b");
    EXPECT_TRUE(
        close_to_torch(conv2d(x, w, b, {c.stride, c.stride}, {c.pad, c.pad}), f.at(n + ".y")));
    EXPECT_TRUE(close_to_torch(conv2d(x, w, Tensor(), {c.stride, c.stride}, {c.pad, c.pad}),
                               f.at(n + ".y_nobias")));
  }
  // The VAE downsample: asymmetric zero padding (bottom and right only), stride 2.
  Conv2dParams p;
  p.stride = {2, 2};
  p.padding = {0, 1, 0, 1};
  EXPECT_TRUE(close_to_torch(conv2d(x, f.at("down.w"), f.at("down.b"), p), f.at("down.y")));
  // A non-contiguous input view gives the same result.
  const Tensor xt = x.permute({0, 1, 3, 2});
  EXPECT_TRUE(close_to_torch(
      conv2d(xt.permute({0, 1, 3, 2}), f.at("k3s1p1.w"), f.at("k3s1p1.b"), {1, 1}, {1, 1}),
      f.at("k3s1p1.y")));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ConvFixture, ::testing::Values("f32", "bf16"));

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Conv2d, ErrorsNameTheOpAndTheShapes) {
  const Tensor x = Tensor::zeros({1, 3, 8, 8}, DType::f32);
  std::string msg = error_of([&] { conv2d(x, Tensor::zeros({4, 2, 3, 3}, DType::f32)); });
  EXPECT_NE(msg.find("[conv2d] input f32(1, 3, 8, 8) has 3 channels but weight f32(4, 2, 3, 3) "
                     "expects 2"),
            std::string::npos)
      << msg;
  msg = error_of([&] { conv2d(x.select(0, 0), Tensor::zeros({4, 3, 3, 3}, DType::f32)); });
  EXPECT_NE(msg.find("[conv2d] input must be 4-D"), std::string::npos) << msg;
  msg = error_of([&] { conv2d(x, Tensor::zeros({4, 3, 3, 3}, DType::bf16)); });
  EXPECT_NE(msg.find("[conv2d] mixed input dtypes: input is f32(1, 3, 8, 8) and weight is bf16"),
            std::string::npos)
      << msg;
  msg = error_of([&] {
    conv2d(x, Tensor::zeros({4, 3, 3, 3}, DType::f32), Tensor::zeros({5}, DType::f32));
  });
  EXPECT_NE(
      msg.find("[conv2d] bias f32(5,) does not match weight f32(4, 3, 3, 3); expected shape (4,)"),
      std::string::npos)
      << msg;
  msg = error_of([&] { conv2d(x, Tensor::zeros({4, 3, 11, 11}, DType::f32)); });
  EXPECT_NE(msg.find("larger than the padded input"), std::string::npos) << msg;
}

TEST(Conv2d, GroupedAndDilatedMatchAManualSum) {
  // groups=2, dilation 2, all-ones data: each output is the count of in-bounds taps x C/groups.
  const Tensor x = Tensor::from_floats(std::vector<float>(1 * 4 * 6 * 6, 1.0f), {1, 4, 6, 6});
  const Tensor w = Tensor::from_floats(std::vector<float>(2 * 2 * 3 * 3, 1.0f), {2, 2, 3, 3});
  Conv2dParams p;
  p.groups = 2;
  p.dilation = {2, 2};
  p.padding = {2, 2, 2, 2};
  const Tensor y = conv2d(x, w, Tensor(), p);
  ASSERT_EQ(y.shape(), (Shape{1, 2, 6, 6}));
  const auto v = y.to_floats();
  EXPECT_FLOAT_EQ(v[0], 2.0f * 4);          // corner: 2x2 taps in bounds
  EXPECT_FLOAT_EQ(v[2 * 6 + 2], 2.0f * 9);  // interior: all 9 taps
}

// oneDNN's default scratchpad belongs to the thread that made the primitive: a gemm-based conv
// made on this thread and run on the async stream's worker (or the reverse) used a null im2col
// buffer and crashed. Both shapes take the im2col path (the first at AVX-512, the second at AVX2).
TEST(Conv2d, AsyncStreamRunsAPrimitiveMadeOnAnotherThread) {
  struct Case {
    Shape x, w;
    Conv2dParams p;
    bool offset;  // x as columns 3..7 of a wider tensor
  };
  Conv2dParams grouped, dilated;
  grouped.groups = 2;
  grouped.stride = {2, 1};
  grouped.padding = {0, 1, 1, 0};
  dilated.stride = {2, 1};
  dilated.padding = {0, 0, 1, 2};
  dilated.dilation = {2, 1};
  const Case cases[] = {{{1, 4, 7, 11}, {6, 2, 3, 3}, grouped, false},
                        {{1, 1, 5, 10}, {2, 1, 3, 1}, dilated, true}};
  Generator gen(18);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      const Tensor base = randn(c.x, dt, gen), w = randn(c.w, dt, gen);
      const Tensor x = c.offset ? base.slice(-1, 3, 8) : base;
      auto run = [&](bool async) {
        set_async_dispatch(async);
        Tensor y = conv2d(x, w, Tensor(), c.p);
        synchronize();
        set_async_dispatch(false);
        return clone(y);
      };
      for (bool async_first : {false, true}) {
        clear_kernel_caches();  // the first run below makes the primitive, the second reuses it
        const Tensor first = run(async_first), second = run(!async_first);
        EXPECT_TRUE(test::bit_equal(second, first))
            << dtype_name(dt) << " " << x.describe() << (async_first ? ", async first" : "");
      }
    }
  }
}

}  // namespace
}  // namespace tessera
