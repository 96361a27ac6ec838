// softmax against torch.softmax goldens (reference/goldens/ops_attention.py).
#include "ops/softmax.h"

#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kFile = "ops/attention/softmax.safetensors";

TEST(Softmax, F32MatchesTorchOnEveryDim) {
  if (!test::has_fixture(kFile)) GTEST_SKIP() << "missing fixture " << kFile;
  auto t = test::load_fixture(kFile);
  // exp differs from torch's vectorised exp by an ulp or so; tiny probabilities need the atol.
  EXPECT_TRUE(test::all_close(softmax(t["x"], -1), t["out_last"], 1e-5, 1e-7));
  EXPECT_TRUE(test::all_close(softmax(t["x"], 1), t["out_dim1"], 1e-5, 1e-7));
  EXPECT_TRUE(test::all_close(softmax(t["x"], 0), t["out_dim0"], 1e-5, 1e-7));
  // A transposed (strided) view gives the same as its contiguous source.
  EXPECT_TRUE(test::all_close(softmax(t["x"].transpose(1, 2), 2).transpose(1, 2), t["out_dim1"],
                              1e-5, 1e-7));
}

TEST(Softmax, Bf16MatchesTorch) {
  if (!test::has_fixture(kFile)) GTEST_SKIP() << "missing fixture " << kFile;
  auto t = test::load_fixture(kFile);
  const Tensor out = softmax(t["xb"], -1);
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_TRUE(test::bf16_close(out, t["xb_out_last"]));
  EXPECT_TRUE(test::bf16_close(softmax(t["xb"], 1), t["xb_out_dim1"]));
}

TEST(Softmax, RejectsIntegers) {
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}, DType::i64), -1), Error);
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}, DType::f32), 2), Error);
}

}  // namespace
}  // namespace tessera
