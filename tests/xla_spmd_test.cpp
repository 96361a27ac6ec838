// SPMD tensor parallelism on XLA devices (decision 0060): one process drives N devices of the
// XLA CPU plugin; weights are stored split by the model's TP plan (each device its piece), the
// compiled program carries mhlo.sharding annotations with num_partitions = N and XLA's
// partitioner inserts the collectives. Runs as its own ctest entry (tests/xla.cmake: xla_spmd)
// with TESSERA_XLA_CPU_DEVICES=4, since the plugin's device count is fixed when it starts.
#include <gtest/gtest.h>

#ifdef TESSERA_HAS_XLA
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/xla/pjrt_client.h"
#include "backends/xla/xla_backend.h"
#include "distributed/tensor_parallel.h"
#include "io/png.h"
#include "models/flux_transformer.h"
#include "nn/tensor_parallel.h"
#include "ops/copy.h"
#include "pipeline_manifest.h"
#include "pipelines/flux_pipeline.h"
#include "runtime/backend.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "runtime/sharding.h"
#include "split_parity.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::error_message;
using test::expect_same_picture;
using test::relative_error;
using test::fixture_path;
using test::has_fixture;

const Device kXla = Device::parse("xla:cpu");

class XlaSpmd : public ::testing::Test {
 protected:
  void SetUp() override {
    bool found = false;
    for (const Device& d : available_devices()) found = found || d == kXla;
    if (!found) GTEST_SKIP() << "no xla:cpu (plugin not installed or TESSERA_PJRT_PLUGIN=none)";
  }
};

struct ModeScope {
  explicit ModeScope(EagerMode m) : prev(eager_mode()) { set_eager_mode(m); }
  ~ModeScope() { set_eager_mode(prev); }
  EagerMode prev;
};

// The compile options proto for 2 partitions: build options (field 3) holding num_replicas 1,
// num_partitions 2, SPMD on and a device assignment of 1 replica x 2 computations on devices 0, 1.
TEST_F(XlaSpmd, CompileOptionsCarryPartitionsAndDeviceAssignment) {
  const std::string o = xla::PjrtClient::compile_options(2, {0, 1});
  const std::string expect = {0x1a, 0x14,                    // build options, 20 bytes
                              0x20, 0x01, 0x28, 0x02, 0x30, 0x01,  // replicas 1, partitions 2, spmd
                              0x4a, 0x0c,                    // device assignment, 12 bytes
                              0x08, 0x01, 0x10, 0x02,        // replica_count 1, computations 2
                              0x1a, 0x02, 0x08, 0x00, 0x1a, 0x02, 0x08, 0x01};
  EXPECT_EQ(o, expect);
  EXPECT_EQ(xla::PjrtClient::compile_options(1, {0}), xla::PjrtClient::compile_options());
}

// A tensor split over 4 devices (rows, columns, packed column blocks) reads back whole; an eager
// op on it is refused by name.
TEST_F(XlaSpmd, SplitStoragesReadBackWholeAndEagerOpsRefuseThem) {
  std::vector<float> v(8 * 12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f - 7.f;
  const Tensor t = Tensor::from_floats(v, {8, 12});
  for (const ShardSpec& spec : {ShardSpec{0, 0, 4, {}}, ShardSpec{1, 0, 4, {}},
                                ShardSpec{1, 0, 2, {4, 8}}}) {
    const Tensor s = to_sharded(t, kXla, spec);
    ASSERT_TRUE(s.storage()->sharding);
    EXPECT_EQ(s.to(Device::cpu()).to_floats(), v) << "dim " << spec.dim;
  }
  const Tensor s = to_sharded(t, kXla, ShardSpec{0, 0, 2, {}});
  ModeScope scope(EagerMode::DeferNever);
  const std::string msg = error_message([&] { (void)contiguous(s.transpose(0, 1)).to_floats(); });
  EXPECT_NE(msg.find("split over 2 devices"), std::string::npos) << msg;
  EXPECT_NE(msg.find("compiled mode"), std::string::npos) << msg;
}

// More devices than xla:cpu has, and --tp on the CPU, are clear errors.
TEST_F(XlaSpmd, TooManyDevicesOrACpuDeviceAreClearErrors) {
  std::string msg = error_message([] { TensorParallelConfig::over_devices(kXla, 64, "[test]"); });
  EXPECT_NE(msg.find("needs 64 devices"), std::string::npos) << msg;
  msg = error_message([] { TensorParallelConfig::over_devices(Device::cpu(), 2, "[test]"); });
  EXPECT_NE(msg.find("only on XLA devices"), std::string::npos) << msg;
}

FluxTransformerInputs on_xla(const FluxTransformerInputs& in) {
  auto up = [](const Tensor& t) { return t.defined() ? t.to(kXla) : t; };
  return {up(in.hidden_states), up(in.encoder_hidden_states), up(in.pooled_projections),
          up(in.timestep),      up(in.img_ids),               up(in.txt_ids),
          up(in.guidance)};
}

// The model split over `split`'s devices against the whole one on xla:cpu (one device, compiled),
// in compiled, regional and deferred modes; every run is an SPMD program.
void expect_split_matches_whole(FluxTransformer2DModel& whole, FluxTransformer2DModel& split,
                                const FluxTransformerInputs& cpu_in, const std::string& what) {
  int splits = 0;
  for (const auto& p : split.named_parameters()) splits += p.split.sharded();
  ASSERT_GT(splits, 20) << what << ": nothing was split";
  const FluxTransformerInputs in = on_xla(cpu_in);
  CompileOptions copt;
  copt.backend = "xla";
  whole.to(kXla);
  whole.compile(copt);
  const Tensor expected = whole.forward(in).to(Device::cpu());
  split.to(kXla);
  for (const std::string mode : {"compile", "regional", "defer"}) {
    ModeScope scope(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    split.reset_compile();
    if (mode == "compile") split.compile(copt);
    if (mode == "regional") split.compile_repeated_blocks(copt);
    for (int call = 0; call < 2; ++call) {  // the second call reuses the executables
      reset_xla_stats();
      Tensor got;
      try {
        got = split.forward(in).to(Device::cpu());
      } catch (const std::exception& e) {
        FAIL() << what << " " << mode << " call " << call << ": " << e.what();
      }
      EXPECT_GT(xla_stats().spmd_runs, 0) << what << " " << mode;
      if (call == 1) EXPECT_EQ(xla_stats().plugin_compiles, 0) << what << " " << mode;
      ASSERT_EQ(got.shape(), expected.shape());
      EXPECT_LE(relative_error(got, expected), 1e-5) << what << " " << mode << " call " << call;
    }
  }
  split.reset_compile();
  whole.reset_compile();
}

// A tiny fixture (2 heads) over 2 devices; 4 devices cannot hold whole heads: a clear error.
void fixture_on_two_devices(const std::string& folder) {
  {
    if (!has_fixture(folder + "/config.json")) GTEST_SKIP() << folder << " missing";
    auto whole = FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32);
    const TensorParallelConfig tp = TensorParallelConfig::over_devices(kXla, 2, "[test]");
    auto split = FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
    expect_split_matches_whole(*whole, *split, test::seeded_flux_inputs(whole->config), folder);
    const TensorParallelConfig tp4 = TensorParallelConfig::over_devices(kXla, 4, "[test]");
    const std::string msg = error_message(
        [&] { FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp4); });
    EXPECT_NE(msg.find("num_attention_heads=2 is not divisible by the tensor-parallel degree 4"),
              std::string::npos)
        << msg;
  }
}
TEST_F(XlaSpmd, FluxSchnellFixtureOnTwoDevicesMatchesOneDevice) {
  fixture_on_two_devices("flux1-schnell-tiny/transformer");
}
TEST_F(XlaSpmd, FluxDevFixtureOnTwoDevicesMatchesOneDevice) {
  fixture_on_two_devices("flux1-dev-tiny/transformer");
}

// A FLUX.1 transformer with 4 heads (random weights) over `n` devices.
void four_heads_on(int n) {
  const FluxTransformerConfig c = test::four_head_flux_config();
  FluxTransformer2DModel whole(c);
  const MapWeightSource source(test::seeded_weights(whole, 11, 0.2), "random FLUX weights");
  whole.load_weights(source, LoadOptions{});
  {
    const TensorParallelConfig tp = TensorParallelConfig::over_devices(kXla, n, "[test]");
    FluxTransformer2DModel split(c);
    parallelize_module(split, split.tp_plan(), tp, "[FluxTransformer2DModel]");
    split.load_weights(source, LoadOptions{});
    expect_split_matches_whole(whole, split, test::seeded_flux_inputs(c),
                               "4 heads over " + std::to_string(n));
  }
}
TEST_F(XlaSpmd, FluxWithFourHeadsOnTwoDevicesMatchesOneDevice) { four_heads_on(2); }
TEST_F(XlaSpmd, FluxWithFourHeadsOnFourDevicesMatchesOneDevice) { four_heads_on(4); }

// Strict eager has no program to split: a clear error naming the modes that run SPMD.
TEST_F(XlaSpmd, StrictEagerIsAClearError) {
  const char* folder = "flux1-schnell-tiny/transformer";
  if (!has_fixture(std::string(folder) + "/config.json")) GTEST_SKIP() << folder << " missing";
  const TensorParallelConfig tp = TensorParallelConfig::over_devices(kXla, 2, "[test]");
  auto split = FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
  split->to(kXla);
  ModeScope scope(EagerMode::DeferNever);
  const FluxTransformerInputs in = on_xla(test::seeded_flux_inputs(split->config));
  const std::string msg = error_message([&] { (void)split->forward(in).to_floats(); });
  EXPECT_NE(msg.find("SPMD runs whole programs only"), std::string::npos) << msg;
}

// The FLUX.1 pipeline golden (schnell, cat, f32) with the transformer compiled over 2 devices:
// every step's latents equal the one-device run within 1e-5 relative, and diffusers' golden as
// the pipeline goldens check it.
TEST_F(XlaSpmd, FluxPipelineOnTwoDevicesMatchesOneDeviceAndTheGolden) {
  const std::string dir = "goldens/flux1-schnell-tiny/pipeline/cat_s0_64x64/f32/";
  std::ifstream min(fixture_path(dir + "manifest.json"));
  if (!min) GTEST_SKIP() << "missing " << dir;
  const auto m = nlohmann::json::parse(min);
  const auto golden = test::load_fixture(dir + "tensors.safetensors");
  auto run = [&](int n) {
    PipelineLoadOptions load{.dtype = DType::f32, .device = kXla};
    if (n > 1) load.tensor_parallel = TensorParallelConfig::over_devices(kXla, n, "[test]");
    auto pipe = FluxPipeline::from_pretrained(fixture_path("flux1-schnell-tiny"), load);
    CompileOptions copt;
    copt.backend = "xla";
    pipe->denoiser().reset_compile();
    pipe->denoiser().compile(copt);
    FluxCallOptions call = test::call_from_manifest<FluxCallOptions>(m);
    std::vector<Tensor> latents;
    call.on_step_end = [&](int, int, const Tensor& l) { latents.push_back(l.to(Device::cpu())); };
    reset_xla_stats();
    const PipelineOutput out = (*pipe)(call);
    EXPECT_EQ(xla_stats().spmd_runs > 0, n > 1);
    latents.push_back(out.image);
    return latents;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i + 1 < two.size(); ++i) {
    EXPECT_LE(relative_error(two[i], one[i]), 1e-5) << "latents." << i;
    EXPECT_TRUE(test::activations_close(two[i], golden.at("latents." + std::to_string(i)),
                                        DType::f32));
  }
  EXPECT_LE(relative_error(two.back(), one.back()), 1e-5) << "image";
}

// Runs `command` through the shell: exit code and stdout + stderr.
std::pair<int, std::string> shell(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// tessera generate --device xla:cpu --tp 2 (one process, no launch) against --tp 1: the same
// picture up to one level on at most 0.1% of the values (partial sums add in another order);
// --tp 4 on the 2-head fixture and --tp 2 in strict eager are clear errors.
TEST_F(XlaSpmd, GenerateWithTpOnXlaCpuWritesThePictureOfOneDevice) {
  if (!has_fixture("flux1-schnell-tiny/model_index.json")) GTEST_SKIP() << "fixture missing";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("tessera-spmd-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string cli = std::string(TESSERA_CLI_PATH) + " generate --model " +
                          fixture_path("flux1-schnell-tiny") +
                          " --prompt 'a cat' --height 64 --width 64 --steps 2 --seed 0 "
                          "--device xla:cpu ";
  const std::string one = (dir / "one.png").string(), two = (dir / "two.png").string();
  const std::string report = (dir / "two.json").string();
  auto a = shell(cli + "--mode compile -o " + one);
  ASSERT_EQ(a.first, 0) << a.second;
  auto b = shell(cli + "--mode compile --tp 2 -o " + two + " --report " + report);
  ASSERT_EQ(b.first, 0) << b.second;
  expect_same_picture(one, two, "flux1-schnell-tiny --tp 2");
  std::ifstream rin(report);
  const auto j = nlohmann::json::parse(rin);
  EXPECT_EQ(j["tensor_parallel"]["degree"], 2);
  EXPECT_EQ(j["tensor_parallel"]["backend"], "spmd");
  auto c = shell(cli + "--mode compile --tp 4 -o " + two);
  EXPECT_NE(c.first, 0);
  EXPECT_NE(c.second.find("num_attention_heads=2 is not divisible by the tensor-parallel degree 4"),
            std::string::npos)
      << c.second;
  auto d = shell(cli + "--mode eager --tp 2 -o " + two);
  EXPECT_NE(d.first, 0);
  EXPECT_NE(d.second.find("--mode compile, --compile-regional or --mode defer"), std::string::npos)
      << d.second;
  std::filesystem::remove_all(dir);
}

// The same for SD3.5 (2 heads: --tp 2) and FLUX.2 (4 heads: --tp 2 and 4), whose transformers
// split over the devices while their text encoders run whole.
TEST_F(XlaSpmd, Sd3AndFlux2GenerateWithTpOnXlaCpuWriteThePictureOfOneDevice) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("tessera-spmd-sd3-flux2-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  for (const auto& [model, degrees] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"sd35-medium-tiny", {2}}, {"flux2-dev-tiny", {2, 4}}}) {
    if (!has_fixture(model + "/model_index.json")) GTEST_SKIP() << model << " missing";
    const std::string cli = std::string(TESSERA_CLI_PATH) + " generate --model " +
                            fixture_path(model) +
                            " --prompt 'a cat' --height 64 --width 64 --steps 2 --seed 0 "
                            "--device xla:cpu --mode compile ";
    const std::string one = (dir / (model + "-1.png")).string();
    const auto a = shell(cli + "-o " + one);
    ASSERT_EQ(a.first, 0) << a.second;
    for (int n : degrees) {
      const std::string many = (dir / (model + "-n.png")).string();
      const auto b = shell(cli + "--tp " + std::to_string(n) + " -o " + many);
      ASSERT_EQ(b.first, 0) << b.second;
      expect_same_picture(one, many, model + " --tp " + std::to_string(n));
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
#endif  // TESSERA_HAS_XLA
