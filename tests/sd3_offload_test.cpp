// StableDiffusion3Pipeline under model and sequential CPU offload (three text encoders, then the
// transformer streamed one JointTransformerBlock at a time, then the VAE): bit-identical to no
// offload in strict eager and deferred modes, the pipeline goldens still met, and weights held at
// once bounded by the largest model.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "pipeline_manifest.h"
#include "pipelines/sd3_pipeline.h"
#include "runtime/memory_stats.h"
#include "runtime/modes.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr const char* kSd3 = "sd35-medium-tiny";
constexpr const char* kCase = "fox_48x80_cfg";  // guidance, 3 steps, 32 T5 tokens

struct SD3Run {
  PipelineOutput out;
  std::vector<Tensor> latents;
  StageMemory load;
};

SD3Run run(DType dtype, OffloadMode offload, const nlohmann::json& m) {
  PipelineLoadOptions load{.dtype = dtype};
  load.offload = offload;
  auto pipe = StableDiffusion3Pipeline::from_pretrained(test::fixture_path(kSd3), load);
  SD3Run r;
  r.load = pipe->load_memory();
  SD3CallOptions call = test::call_from_manifest<SD3CallOptions>(m);
  call.on_step_end = [&](int, int, const Tensor& l) { r.latents.push_back(l); };
  r.out = (*pipe)(call);
  return r;
}

StageMemory total(const SD3Run& r) {
  StageMemory t = r.load;
  t.merge(r.out.memory.encode);
  t.merge(r.out.memory.denoise);
  t.merge(r.out.memory.decode);
  return t;
}

class ModeGuard {
 public:
  explicit ModeGuard(EagerMode m) : prev_(eager_mode()) { set_eager_mode(m); }
  ~ModeGuard() { set_eager_mode(prev_); }

 private:
  EagerMode prev_;
};

struct Case {
  std::string dtype, mode;
};

class SD3OffloadParity : public ::testing::TestWithParam<Case> {};

TEST_P(SD3OffloadParity, IdenticalToNoOffloadAndMeetsGoldens) {
  const Case& c = GetParam();
  const std::string dir =
      std::string("goldens/") + kSd3 + "/pipeline/" + kCase + "/" + c.dtype + "/";
  if (!test::has_fixture(dir + "manifest.json")) GTEST_SKIP() << "missing " << dir;
  std::ifstream in(test::fixture_path(dir + "manifest.json"));
  const auto m = nlohmann::json::parse(in);
  const auto golden = test::load_fixture(dir + "tensors.safetensors");
  const ModeGuard guard(c.mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
  const DType dtype = dtype_from_name(c.dtype);

  // Every model's parameter bytes (what no offload holds at once).
  auto full = StableDiffusion3Pipeline::from_pretrained(test::fixture_path(kSd3), {.dtype = dtype});
  const std::vector<int64_t> bytes = {
      full->text_encoder->parameter_bytes(), full->text_encoder_2->parameter_bytes(),
      full->text_encoder_3->parameter_bytes(), full->transformer->parameter_bytes(),
      full->vae->parameter_bytes()};
  int64_t largest = 0, sum = 0;
  for (int64_t b : bytes) largest = std::max(largest, b), sum += b;
  full.reset();

  const SD3Run base = run(dtype, OffloadMode::none, m);
  EXPECT_EQ(total(base).peak_weight_bytes, sum);
  EXPECT_EQ(base.out.memory.denoise.disk_read_bytes, 0);
  for (OffloadMode mode : {OffloadMode::model, OffloadMode::sequential}) {
    SCOPED_TRACE(offload_mode_name(mode));
    const SD3Run r = run(dtype, mode, m);
    ASSERT_EQ(r.latents.size(), base.latents.size());
    for (size_t i = 0; i < r.latents.size(); ++i) {
      EXPECT_TRUE(test::bit_equal(r.latents[i], base.latents[i])) << "step " << i;
      if (dtype == DType::f32)  // the guided bf16 bound lives in sd3_pipeline_test
        EXPECT_TRUE(
            test::activations_close(r.latents[i], golden.at("latents." + std::to_string(i)), dtype))
            << "step " << i;
    }
    EXPECT_TRUE(test::bit_equal(r.out.image, base.out.image));
    EXPECT_LE(total(r).peak_weight_bytes, largest + largest / 10);
    EXPECT_GT(total(r).peak_weight_bytes, 0);
    EXPECT_GT(r.out.memory.encode.disk_read_bytes, 0);
    EXPECT_GT(r.out.memory.denoise.disk_read_bytes, 0);
    EXPECT_GT(r.out.memory.decode.disk_read_bytes, 0);
    if (mode == OffloadMode::sequential)  // one block at a time
      EXPECT_LT(r.out.memory.denoise.peak_weight_bytes, bytes[3]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SD3OffloadParity,
                         ::testing::Values(Case{"f32", "eager"}, Case{"f32", "defer"},
                                           Case{"bf16", "eager"}, Case{"bf16", "defer"}),
                         [](const auto& info) { return info.param.dtype + "_" + info.param.mode; });

}  // namespace
}  // namespace tessera
