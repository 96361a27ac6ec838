// Embedding lookup and diffusers' get_timestep_embedding against goldens.
#include "ops/embedding.h"

#include "ops/copy.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

const char* kShape = "ops/elementwise/shape.safetensors";
const char* kTimestep = "ops/elementwise/timestep.safetensors";

TEST(Embedding, LookupMatchesTorch) {
  if (!test::has_fixture(kShape)) GTEST_SKIP() << "missing fixture " << kShape;
  auto f = test::load_fixture(kShape);
  const Tensor w = f.at("emb_w"), ids = f.at("emb_ids");
  EXPECT_TRUE(test::bit_equal(embedding(w, ids), f.at("emb_out")));
  EXPECT_TRUE(test::bit_equal(embedding(astype(w, DType::bf16), astype(ids, DType::i32)),
                              f.at("emb_out_bf16")));
}

TEST(Embedding, OutOfRangeIdIsAClearError) {
  const Tensor w = Tensor::zeros({11, 4}, DType::f32);
  // The id check runs in the kernel, so read the result: in deferred mode that is where it runs.
  try {
    embedding(w, Tensor::from_ints({1, 11}, {2})).to_floats();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[embedding]"), std::string::npos) << m;
    EXPECT_NE(m.find("11"), std::string::npos) << m;
  }
  EXPECT_THROW(embedding(w, Tensor::from_ints({-1}, {1})).to_floats(), Error);
  EXPECT_THROW(embedding(w, Tensor::zeros({2}, DType::f32)), Error);
}

TEST(Embedding, TimestepEmbeddingMatchesDiffusers) {
  if (!test::has_fixture(kTimestep)) GTEST_SKIP() << "missing fixture " << kTimestep;
  auto f = test::load_fixture(kTimestep);
  const Tensor t = f.at("timesteps");
  // torch's vectorised expf (Sleef) is off by one ulp from the correctly rounded frequency for
  // a few indices (13, 44, 119 of 128); t = 1000 turns that into ~6e-5 on sin/cos arguments.
  // Values lie in [-1, 1], so an absolute 1e-4.
  EXPECT_TRUE(test::all_close(timestep_embedding(t, 256, true, 0), f.at("flux"), 1e-5, 1e-4));
  EXPECT_TRUE(test::all_close(timestep_embedding(t, 320, false, 1), f.at("sd_shift1"), 1e-5, 1e-4));
  EXPECT_TRUE(test::all_close(timestep_embedding(t, 33, true, 0.5, 2.0, 5000), f.at("odd_scaled"),
                              1e-5, 1e-4));
  // The t = 0 and t = 1 rows carry no amplification and hold to 1e-6.
  const Tensor small = timestep_embedding(t.slice(0, 0, 2), 256, true, 0);
  EXPECT_TRUE(test::all_close(small, f.at("flux").slice(0, 0, 2), 1e-5, 1e-6));
}

}  // namespace
}  // namespace tessera
