// RoPE tables and rotation against diffusers (FluxPosEmbed, Flux2PosEmbed, apply_rotary_emb)
// and transformers' Mistral apply_rotary_pos_emb (reference/goldens/ops_attention.py).
#include "ops/rope.h"

#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kFile = "ops/attention/rope.safetensors";

class Rope : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::has_fixture(kFile)) GTEST_SKIP() << "missing fixture " << kFile;
    t = test::load_fixture(kFile);
  }
  std::map<std::string, Tensor> t;
};

// Tables: float64 math rounded to f32, as diffusers; pow/cos may differ from torch's (Sleef) by
// a double ulp, which survives the rounding to f32 only rarely, so allow one f32 ulp.
TEST_F(Rope, FluxTables) {
  auto [c, s] = rope_frequencies(t["flux_ids"], {16, 56, 56}, 10000.0);
  EXPECT_TRUE(test::all_close(c, t["flux_cos"], 1e-7, 1e-7));
  EXPECT_TRUE(test::all_close(s, t["flux_sin"], 1e-7, 1e-7));
}

TEST_F(Rope, Flux2Tables) {
  auto [c, s] = rope_frequencies(t["flux2_ids"], {32, 32, 32, 32}, 2000.0);
  EXPECT_TRUE(test::all_close(c, t["flux2_cos"], 1e-7, 1e-7));
  EXPECT_TRUE(test::all_close(s, t["flux2_sin"], 1e-7, 1e-7));
}

TEST_F(Rope, BatchedIdsRepeatTheTable) {
  const Tensor ids = t["flux_ids"].unsqueeze(0).expand({2, -1, -1});
  auto [c, s] = rope_frequencies(ids, {16, 56, 56}, 10000.0);
  ASSERT_EQ(c.shape(), (Shape{2, t["flux_ids"].dim(0), 128}));
  EXPECT_TRUE(test::all_close(c.select(0, 1), t["flux_cos"], 1e-7, 1e-7));
}

TEST_F(Rope, InterleavedF32) {
  const Tensor out = apply_rope(t["x_interleaved"], t["flux_cos"], t["flux_sin"],
                                RopeLayout::interleaved, /*sequence_dim=*/1);
  EXPECT_TRUE(test::all_close(out, t["out_interleaved"], 1e-5, 1e-6));
}

TEST_F(Rope, InterleavedBf16) {
  const Tensor out =
      apply_rope(t["xb_interleaved"], t["flux_cos"], t["flux_sin"], RopeLayout::interleaved, 1);
  EXPECT_TRUE(test::bf16_close(out, t["outb_interleaved"]));
}

TEST_F(Rope, SplitHalvesF32) {
  const Tensor out =
      apply_rope(t["x_split"], t["cos_cat"], t["sin_cat"], RopeLayout::split_halves, 2);
  EXPECT_TRUE(test::all_close(out, t["out_split"], 1e-5, 1e-6));
}

TEST_F(Rope, MistralBf16Math) {
  const Tensor out = apply_rope(t["x_mistral"], t["cos_cat"], t["sin_cat"],
                                RopeLayout::split_halves, 2, RopeMath::input_dtype);
  EXPECT_TRUE(test::bit_equal(out, t["out_mistral"]));
}

TEST_F(Rope, BatchedTablesAndBadShapes) {
  const Tensor c = t["cos_cat"].unsqueeze(0).expand({2, -1, -1});
  const Tensor s = t["sin_cat"].unsqueeze(0).expand({2, -1, -1});
  const Tensor out = apply_rope(t["x_split"], c, s, RopeLayout::split_halves, 2);
  EXPECT_TRUE(test::all_close(out, t["out_split"], 1e-5, 1e-6));
  EXPECT_THROW(apply_rope(t["x_split"], t["flux_cos"], t["flux_sin"], RopeLayout::interleaved, 2),
               Error);
  EXPECT_THROW(rope_frequencies(t["flux_ids"], {16, 56, 56, 8}, 10000.0), Error);
}

}  // namespace
}  // namespace tessera
