// Model and sequential CPU offload: the same numbers as without offload (bit for bit, in strict
// eager and deferred modes), the pipeline goldens still met, weights held at once bounded by the
// largest model, device errors that name what is available, and the memory accounting.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io_test_folder.h"
#include "pipeline_manifest.h"
#include "pipelines/flux_pipeline.h"
#include "runtime/error.h"
#include "runtime/memory_stats.h"
#include "runtime/modes.h"
#include "test_util.h"

namespace tessera {
namespace {

struct OffloadRun {
  PipelineOutput out;
  std::vector<Tensor> latents;  // after each step
  StageMemory load;
  int64_t model_bytes[4] = {};  // text_encoder, text_encoder_2, transformer, vae (run dtype)
};

struct Case {
  std::string model, golden_case, dtype, mode;
};

// The pipeline golden of `c` run under `offload`.
OffloadRun run_case(const Case& c, OffloadMode offload) {
  const std::string dir = "goldens/" + c.model + "/pipeline/" + c.golden_case + "/" + c.dtype + "/";
  std::ifstream in(test::fixture_path(dir + "manifest.json"));
  const auto m = nlohmann::json::parse(in);
  PipelineLoadOptions load{.dtype = dtype_from_name(c.dtype)};
  load.offload = offload;
  auto pipe = FluxPipeline::from_pretrained(test::fixture_path(c.model), load);
  OffloadRun r;
  r.load = pipe->load_memory();
  FluxCallOptions call = test::call_from_manifest<FluxCallOptions>(m);
  call.on_step_end = [&](int, int, const Tensor& l) { r.latents.push_back(l); };
  r.out = (*pipe)(call);
  // Parameter sizes with every model materialised (what no offload holds at once).
  auto full = FluxPipeline::from_pretrained(test::fixture_path(c.model),
                                            {.dtype = dtype_from_name(c.dtype)});
  r.model_bytes[0] = full->text_encoder->parameter_bytes();
  r.model_bytes[1] = full->text_encoder_2->parameter_bytes();
  r.model_bytes[2] = full->transformer->parameter_bytes();
  r.model_bytes[3] = full->vae->parameter_bytes();
  return r;
}

StageMemory total(const OffloadRun& r) {
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

class OffloadParity : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadParity, IdenticalToNoOffloadAndMeetsGoldens) {
  const Case& c = GetParam();
  const ModeGuard guard(c.mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
  const DType dtype = dtype_from_name(c.dtype);
  const OffloadRun base = run_case(c, OffloadMode::none);
  const auto golden = test::load_fixture("goldens/" + c.model + "/pipeline/" + c.golden_case + "/" +
                                         c.dtype + "/tensors.safetensors");
  for (OffloadMode mode : {OffloadMode::model, OffloadMode::sequential}) {
    SCOPED_TRACE(offload_mode_name(mode));
    const OffloadRun r = run_case(c, mode);
    ASSERT_EQ(r.latents.size(), base.latents.size());
    for (size_t i = 0; i < r.latents.size(); ++i) {
      EXPECT_TRUE(test::bit_equal(r.latents[i], base.latents[i])) << "step " << i;
      EXPECT_TRUE(
          test::activations_close(r.latents[i], golden.at("latents." + std::to_string(i)), dtype))
          << "step " << i;
    }
    EXPECT_TRUE(test::bit_equal(r.out.image, base.out.image));
    ASSERT_EQ(r.out.images.size(), base.out.images.size());
    EXPECT_EQ(r.out.images[0].pixels, base.out.images[0].pixels);

    // Weights held at once: the largest model (+10%) under offload, the sum without.
    const int64_t* b = base.model_bytes;
    const int64_t largest = std::max(std::max(b[0], b[1]), std::max(b[2], b[3]));
    const int64_t sum = b[0] + b[1] + b[2] + b[3];
    EXPECT_EQ(total(base).peak_weight_bytes, sum);
    EXPECT_LE(total(r).peak_weight_bytes, largest + largest / 10);
    EXPECT_GT(total(r).peak_weight_bytes, 0);
    // Under offload every stage reads its model's weights from the checkpoint.
    EXPECT_GT(r.out.memory.encode.disk_read_bytes, 0);
    EXPECT_GT(r.out.memory.denoise.disk_read_bytes, 0);
    EXPECT_GT(r.out.memory.decode.disk_read_bytes, 0);
    // Loading under offload releases each model at once: a zero-copy (bf16) load reads nothing.
    if (dtype == DType::bf16) EXPECT_EQ(r.load.disk_read_bytes, 0);
    EXPECT_LE(r.load.peak_weight_bytes, largest + largest / 10);
    if (mode == OffloadMode::sequential) {
      // One block at a time: less than the whole transformer.
      EXPECT_LT(r.out.memory.denoise.peak_weight_bytes, b[2]);
    }
  }
  EXPECT_EQ(base.out.memory.denoise.disk_read_bytes, 0);  // loaded once, at from_pretrained
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string model : {"flux1-schnell-tiny", "flux1-dev-tiny"}) {
    std::ifstream in(test::fixture_path("goldens/" + model + "/index.json"));
    if (!in) continue;
    const std::string first = nlohmann::json::parse(in)["cases"][0];
    for (const std::string dtype : {"f32", "bf16"})
      for (const std::string mode : {"eager", "defer"}) out.push_back({model, first, dtype, mode});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OffloadParity, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string n =
                               info.param.model + "_" + info.param.dtype + "_" + info.param.mode;
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(Offload, MissingDeviceIsNamedWithWhatIsAvailable) {
  auto pipe = FluxPipeline::from_pretrained(test::fixture_path("flux1-schnell-tiny"));
  for (const char* dev : {"cuda:0", "tpu:1"}) {
    const std::string msg =
        test::error_message([&] { pipe->enable_model_cpu_offload(Device::parse(dev)); });
    EXPECT_NE(msg.find(dev), std::string::npos) << msg;
    EXPECT_NE(msg.find("available: cpu"), std::string::npos) << msg;
    const std::string msg2 =
        test::error_message([&] { pipe->enable_sequential_cpu_offload(Device::parse(dev)); });
    EXPECT_NE(msg2.find(dev), std::string::npos) << msg2;
  }
  EXPECT_EQ(pipe->offload_mode(), OffloadMode::none);
  pipe->enable_model_cpu_offload();  // detected: the CPU on a CPU-only build
  EXPECT_EQ(pipe->execution_device(), Device::cpu());
  EXPECT_EQ(pipe->offload_mode(), OffloadMode::model);
  EXPECT_EQ(pipe->transformer->parameter_bytes(), 0);  // released until it runs
}

// tessera generate --offload: the same PNG bytes as without, the report's memory object, and
// the missing-device error.
TEST(Offload, CliOffloadFlagAndReport) {
  test::TempDir tmp;
  const std::string model = test::quote(test::fixture_path("flux1-schnell-tiny"));
  std::map<std::string, std::string> png;
  for (const std::string mode : {"none", "model", "sequential"}) {
    const test::CliResult r = test::run_cli(
        "generate --prompt cat --model " + model +
        " --height 32 --width 32 --steps 1 --seed 3 --offload " + mode + " --output " +
        test::quote(tmp / (mode + ".png")) + " --report " + test::quote(tmp / (mode + ".json")));
    ASSERT_EQ(r.code, 0) << r.err;
    png[mode] = test::read_text(tmp / (mode + ".png"));
    std::ifstream f(tmp / (mode + ".json"));
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j["offload"], mode);
    for (const char* k : {"peak_device_bytes", "peak_host_bytes", "peak_weight_bytes",
                          "disk_read_bytes", "storage_read_bytes"}) {
      EXPECT_TRUE(j["memory"].contains(k)) << k;
      for (const char* stage : {"load", "encode", "denoise", "decode"})
        EXPECT_TRUE(j["memory"]["stages"][stage].contains(k)) << stage << " " << k;
    }
    EXPECT_GT(j["memory"]["peak_weight_bytes"].get<int64_t>(), 0);
  }
  EXPECT_EQ(png["model"], png["none"]);
  EXPECT_EQ(png["sequential"], png["none"]);
  const test::CliResult bad =
      test::run_cli("generate --prompt cat --model " + model +
                    " --device cuda:1 --offload model --output " + test::quote(tmp / "x.png"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("cuda:1"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("available: cpu"), std::string::npos) << bad.err;
}

TEST(Offload, ModeNames) {
  EXPECT_EQ(offload_mode_from_name("sequential"), OffloadMode::sequential);
  EXPECT_STREQ(offload_mode_name(OffloadMode::model), "model");
  const std::string msg = test::error_message([] { offload_mode_from_name("disk"); });
  EXPECT_NE(msg.find("'disk'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("none, model or sequential"), std::string::npos) << msg;
}

TEST(Offload, MappedPagesAreAdvisedOnlyForMappedTensors) {
  const auto tensors = load_safetensors(
      test::fixture_path("flux1-schnell-tiny/vae/diffusion_pytorch_model.safetensors"));
  const Tensor& mapped = tensors.begin()->second;
  EXPECT_TRUE(advise_mapped(mapped, MapAdvice::will_need));
  EXPECT_TRUE(advise_mapped(mapped, MapAdvice::dont_need));
  const auto before = mapped.to_floats();  // dropped pages read back from the file
  EXPECT_TRUE(advise_mapped(mapped, MapAdvice::dont_need));
  EXPECT_EQ(mapped.to_floats(), before);
  const Tensor owned = Tensor::zeros({1024}, DType::f32);
  EXPECT_FALSE(advise_mapped(owned, MapAdvice::dont_need));
  EXPECT_FALSE(advise_mapped(Tensor(), MapAdvice::dont_need));
}

TEST(MemoryStats, ResidentAndStageCounters) {
  EXPECT_GT(resident_bytes(), 0);
  EXPECT_GE(peak_resident_bytes(), resident_bytes() / 2);
  const StageMemoryMeter meter;
  note_weights_materialised(1000);
  note_weights_released(1000);
  note_checkpoint_read(500);
  const StageMemory s = meter.finish();
  EXPECT_GE(s.peak_weight_bytes, 1000);
  EXPECT_EQ(s.disk_read_bytes, 500);
  EXPECT_GT(s.peak_host_bytes, 0);
  const auto j = nlohmann::json::parse(s.json());
  EXPECT_EQ(j["disk_read_bytes"], 500);
  EXPECT_TRUE(j.contains("peak_device_bytes"));
}

}  // namespace
}  // namespace tessera
