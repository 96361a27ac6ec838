// compile() on the text encoders and the VAE decoder: each output bit-equal to strict eager, one
// program per input signature (the hidden-states variant is its own), later calls hit the cache.
#include <gtest/gtest.h>

#include <vector>

#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/t5_encoder.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

Tensor token_ids(int64_t n, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back((i * 37 + 5) % vocab);
  return Tensor::from_ints(ids, {1, n});
}

Tensor padding_mask(int64_t n, int64_t valid) {
  std::vector<int64_t> m;
  for (int64_t i = 0; i < n; ++i) m.push_back(i < valid ? 1 : 0);
  return Tensor::from_ints(m, {1, n});
}

// Both runs' tensors, field by field.
void expect_same(const std::vector<Tensor>& compiled, const std::vector<Tensor>& eager) {
  ASSERT_EQ(compiled.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i)
    EXPECT_TRUE(test::bit_equal(compiled[i], eager[i])) << "output " << i;
}

class CompileModels : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { reset_mode_stats(); }
  void TearDown() override { reset_mode_stats(); }
};

template <typename Model>
std::vector<Tensor> clip_fields(const Model& m, const Tensor& ids, bool hidden, bool masked) {
  CLIPTextForwardOptions o;
  o.output_hidden_states = hidden;
  if (masked) o.attention_mask = padding_mask(ids.dim(1), ids.dim(1) - 3);
  const CLIPTextOutput r = m.forward(ids, nullptr, o);
  std::vector<Tensor> v{r.last_hidden_state, r.pooler_output};
  if (r.text_embeds.defined()) v.push_back(r.text_embeds);
  v.insert(v.end(), r.hidden_states.begin(), r.hidden_states.end());
  return v;
}

// The same calls eager, then compiled twice: bits, programs and cache hits.
template <typename Model>
void check_clip(Model& m) {
  const Tensor ids = token_ids(16, 49408);
  std::vector<std::vector<Tensor>> ref;
  for (bool hidden : {false, true})
    for (bool masked : {false, true}) ref.push_back(clip_fields(m, ids, hidden, masked));
  m.compile();
  reset_mode_stats();
  for (int pass = 0; pass < 2; ++pass) {
    size_t k = 0;
    for (bool hidden : {false, true})
      for (bool masked : {false, true}) expect_same(clip_fields(m, ids, hidden, masked), ref[k++]);
  }
  // hidden states x mask present: four signatures, each traced once and reused once.
  EXPECT_EQ(mode_stats().program_compiles, 4);
  EXPECT_EQ(mode_stats().program_cache_hits, 4);
  EXPECT_EQ(mode_stats().mode, "compile");
}

TEST_P(CompileModels, ClipTextModelMatchesEager) {
  const std::string dir = "flux1-schnell-tiny/text_encoder";
  if (!test::has_fixture(dir + "/config.json")) GTEST_SKIP() << "missing " << dir;
  auto m = CLIPTextModel::from_pretrained(test::fixture_path(dir), GetParam());
  check_clip(*m);
}

TEST_P(CompileModels, ClipTextModelWithProjectionMatchesEager) {
  const std::string dir = "sd35-medium-tiny/text_encoder_2";
  if (!test::has_fixture(dir + "/config.json")) GTEST_SKIP() << "missing " << dir;
  auto m = CLIPTextModelWithProjection::from_pretrained(test::fixture_path(dir), GetParam());
  check_clip(*m);
}

TEST_P(CompileModels, T5EncoderMatchesEager) {
  const std::string dir = "flux1-schnell-tiny/text_encoder_2";
  if (!test::has_fixture(dir + "/config.json")) GTEST_SKIP() << "missing " << dir;
  auto m = T5EncoderModel::from_pretrained(test::fixture_path(dir), GetParam());
  const Tensor ids = token_ids(24, 1300);
  auto run = [&](bool hidden, bool masked) {
    T5EncoderForwardOptions o;
    o.output_hidden_states = hidden;
    if (masked) o.attention_mask = padding_mask(24, 20);
    const T5EncoderOutput r = m->forward(ids, nullptr, o);
    std::vector<Tensor> v{r.last_hidden_state};
    v.insert(v.end(), r.hidden_states.begin(), r.hidden_states.end());
    return v;
  };
  const auto plain = run(false, false), hidden = run(true, false), masked = run(false, true);
  m->compile();
  reset_mode_stats();
  for (int pass = 0; pass < 2; ++pass) {
    expect_same(run(false, false), plain);
    expect_same(run(true, false), hidden);
    expect_same(run(false, true), masked);
  }
  EXPECT_EQ(mode_stats().program_compiles, 3);
  EXPECT_EQ(mode_stats().program_cache_hits, 3);
}

TEST_P(CompileModels, VaeDecodeMatchesEagerAndCompilesOncePerSize) {
  const std::string dir = "flux1-schnell-tiny/vae";
  if (!test::has_fixture(dir + "/config.json")) GTEST_SKIP() << "missing " << dir;
  auto vae = AutoencoderKL::from_pretrained(test::fixture_path(dir), GetParam());
  Generator g(7);
  const Tensor z8 = randn({1, 16, 4, 4}, GetParam(), g);
  const Tensor z6 = randn({1, 16, 4, 6}, GetParam(), g);
  const Tensor ref8 = vae->decode(z8), ref6 = vae->decode(z6);
  vae->compile();
  reset_mode_stats();
  EXPECT_TRUE(test::bit_equal(vae->decode(z8), ref8));
  EXPECT_TRUE(test::bit_equal(vae->decode(z8), ref8));
  EXPECT_EQ(mode_stats().program_compiles, 1);
  EXPECT_TRUE(test::bit_equal(vae->decode(z6), ref6));  // a new size: one more program
  EXPECT_TRUE(test::bit_equal(vae->decode(z8), ref8));  // back: nothing compiles
  EXPECT_EQ(mode_stats().program_compiles, 2);
  EXPECT_EQ(mode_stats().program_cache_hits, 2);
  // Capturing activations runs eagerly and still gives eager's output.
  std::map<std::string, Tensor> cap;
  EXPECT_TRUE(test::bit_equal(vae->decode(z8, &cap), ref8));
  EXPECT_FALSE(cap.empty());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CompileModels, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace tessera
