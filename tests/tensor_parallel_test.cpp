// Tensor parallelism (src/distributed, decision 0040). Three groups:
//  * TensorParallel.*      one process: shard specs, sliced reads, the FLUX.1 plan's per-rank
//                          loading (a stand-in group gives the rank), clear errors;
//  * TensorParallelMpi.*   under mpirun (tests/tensor_parallel.cmake: 2 and 4 ranks; skipped
//                          elsewhere): collectives, and the FLUX.1 transformer split over every
//                          rank against the whole model in every execution mode;
//  * TensorParallelLaunch.* tessera launch end to end: the same PNG as TP=1, bytes read per rank,
//                          a killed rank stopping every rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "distributed/collectives.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "io/checkpoint.h"
#include "io/png.h"
#include "models/flux2_transformer.h"
#include "models/flux_transformer.h"
#include "models/sd3_transformer.h"
#include "nn/tensor_parallel.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::error_message;
using test::fixture_path;
using test::has_fixture;

// A group that only knows its rank: enough to split and load (no collective runs).
class StandInGroup final : public ProcessGroup {
 public:
  StandInGroup(int rank, int size) : rank_(rank), size_(size) {}
  std::string backend() const override { return "stand-in"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(void*, int64_t, DType) override { fail(); }
  void all_gather(const void*, void*, size_t) override { fail(); }
  void broadcast(void*, size_t, int) override { fail(); }
  void barrier() override { fail(); }
  int64_t collectives() const override { return 0; }

 private:
  [[noreturn]] static void fail() { throw Error("stand-in group: no collectives"); }
  int rank_, size_;
};

TensorParallelConfig stand_in(int rank, int size) {
  TensorParallelConfig tp;
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(r);
  tp.mesh = DeviceMesh(DeviceType::cpu, ranks);
  tp.group = std::make_shared<StandInGroup>(rank, size);
  return tp;
}

// max |a - e| / max |e|: "within 1e-5 relative" for a whole activation.
double relative_error(const Tensor& a, const Tensor& e) {
  const auto av = a.to_floats(), ev = e.to_floats();
  EXPECT_EQ(av.size(), ev.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < av.size() && i < ev.size(); ++i) {
    diff = std::max(diff, double(std::fabs(av[i] - ev[i])));
    scale = std::max(scale, double(std::fabs(ev[i])));
  }
  return diff / std::max(scale, 1e-30);
}

Tensor arange_tensor(const Shape& shape) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return Tensor::from_floats(v, shape);
}

TEST(TensorParallel, ShardSpecSplitsEachPackedBlock) {
  ShardSpec s;
  s.dim = 1;
  s.parts = 2;
  s.index = 1;
  EXPECT_EQ(s.local_shape({4, 8}), (Shape{4, 4}));
  EXPECT_EQ(s.ranges(8), (std::vector<std::pair<int64_t, int64_t>>{{4, 8}}));
  s.packed = {4, 12};  // FLUX single blocks' proj_out: [attention, MLP]
  EXPECT_EQ(s.ranges(16), (std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {10, 16}}));
  EXPECT_EQ(s.local_shape({3, 16}), (Shape{3, 8}));
}

TEST(TensorParallel, ReadShardTakesRowsColumnsAndPackedBlocks) {
  const Tensor full = arange_tensor({4, 6});  // value = 6 * row + column
  ShardSpec rows{0, 1, 2, {}};
  EXPECT_EQ(read_shard(full, rows).to_floats(), (std::vector<float>{12, 13, 14, 15, 16, 17, 18,
                                                                     19, 20, 21, 22, 23}));
  ShardSpec cols{1, 0, 2, {}};
  EXPECT_EQ(read_shard(full, cols).to_floats(),
            (std::vector<float>{0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20}));
  ShardSpec packed{1, 1, 2, {2, 4}};  // columns 1 and 4, 5
  EXPECT_EQ(read_shard(full, packed).to_floats(),
            (std::vector<float>{1, 4, 5, 7, 10, 11, 13, 16, 17, 19, 22, 23}));
}

TEST(TensorParallel, PlanPatternsMatchOneComponentPerStar) {
  EXPECT_TRUE(tp_pattern_matches("transformer_blocks.*.attn.to_out.0",
                                 "transformer_blocks.12.attn.to_out.0"));
  EXPECT_FALSE(tp_pattern_matches("transformer_blocks.*.attn.to_q",
                                  "single_transformer_blocks.0.attn.to_q"));
  EXPECT_FALSE(tp_pattern_matches("transformer_blocks.*.ff.net.0.proj",
                                  "transformer_blocks.0.ff.net.0"));
}

TEST(TensorParallel, UnknownBackendOrNoMpiIsAClearError) {
  EXPECT_NE(error_message([] { init_process_group("nccl"); }).find("unknown backend 'nccl'"),
            std::string::npos);
  if (!mpi_available())
    EXPECT_NE(error_message([] { init_process_group("mpi"); }).find("no MPI backend"),
              std::string::npos);
}

const char* kSchnell = "flux1-schnell-tiny/transformer";

// Loads rank `rank` of `size` and counts the checkpoint bytes each parameter was filled from.
struct RankLoad {
  std::unique_ptr<FluxTransformer2DModel> model;
  int64_t bytes_read = 0;
};
class ByteCounter final : public LoadObserver {
 public:
  ByteCounter() : prev_(set_load_observer(this)) {}
  ~ByteCounter() override { set_load_observer(prev_); }
  void loaded(Tensor*, const Tensor& source, DType) override { bytes += int64_t(source.nbytes()); }
  int64_t bytes = 0;

 private:
  LoadObserver* prev_;
};
RankLoad load_rank(const std::string& folder, const TensorParallelConfig* tp) {
  ByteCounter counter;
  RankLoad r;
  r.model = FluxTransformer2DModel::from_pretrained(folder, DType::f32, tp);
  r.bytes_read = counter.bytes;
  return r;
}

TEST(TensorParallel, FluxRanksLoadExactlyTheirSlices) {
  if (!has_fixture(std::string(kSchnell) + "/config.json"))
    GTEST_SKIP() << "fixture " << kSchnell << " missing";
  const std::string folder = fixture_path(kSchnell);
  const RankLoad whole = load_rank(folder, nullptr);
  // The checkpoint's bytes of the tensors the plan splits, and of the rest.
  const CheckpointReader ckpt = CheckpointReader::open(folder);
  int64_t sharded = 0, total = 0;
  {
    const auto plan = whole.model->tp_plan();
    for (const auto& name : ckpt.names()) {
      const SafetensorsEntry& e = ckpt.entry(name);
      const int64_t b = int64_t(e.end - e.begin);
      total += b;
      for (const auto& entry : plan.entries)
        if (tp_pattern_matches(entry.pattern + ".weight", name) ||
            (entry.style == ParallelStyle::colwise &&
             tp_pattern_matches(entry.pattern + ".bias", name)))
          sharded += b;
    }
  }
  EXPECT_EQ(whole.bytes_read, total);
  ASSERT_GT(sharded, total / 2);  // the blocks' projections are most of the transformer
  const auto whole_params = whole.model->named_parameters();
  for (int rank = 0; rank < 2; ++rank) {
    const TensorParallelConfig tp = stand_in(rank, 2);
    const RankLoad part = load_rank(folder, &tp);
    // Only this rank's slices are read: exactly half of every split tensor, all of the others.
    EXPECT_EQ(part.bytes_read, total - sharded + sharded / 2) << "rank " << rank;
    const auto params = part.model->named_parameters();
    ASSERT_EQ(params.size(), whole_params.size());
    int split = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      ASSERT_EQ(p.name, whole_params[i].name);
      const Tensor expected = p.shard.sharded() ? read_shard(*whole_params[i].slot, p.shard)
                                                : *whole_params[i].slot;
      EXPECT_TRUE(test::bit_equal(contiguous(*p.slot), contiguous(expected))) << p.name;
      split += p.shard.sharded();
    }
    // Per double block: 6 q/k/v, 2 attention outputs, 2 x (MLP in, its bias, MLP out) ... at
    // least one split per planned Linear.
    EXPECT_GT(split, 20);
  }
}

TEST(TensorParallel, HeadsTheDegreeDoesNotDivideAreAClearError) {
  if (!has_fixture(std::string(kSchnell) + "/config.json")) GTEST_SKIP() << "fixture missing";
  // The tiny fixtures have 2 heads: 4 ranks cannot each hold whole heads.
  const TensorParallelConfig tp = stand_in(0, 4);
  const std::string msg = error_message(
      [&] { FluxTransformer2DModel::from_pretrained(fixture_path(kSchnell), DType::f32, &tp); });
  EXPECT_NE(msg.find("[FluxTransformer2DModel] num_attention_heads=2 is not divisible by the "
                     "tensor-parallel degree 4"),
            std::string::npos)
      << msg;
}

// ---- under mpirun -------------------------------------------------------------------------

// Leaves the group once every MPI test ran (MPI_Finalize: mpirun counts a rank that did not as
// failed).
class LeaveGroup : public ::testing::Environment {
 public:
  void TearDown() override { destroy_process_group(); }
};
const auto* const kLeaveGroup = ::testing::AddGlobalTestEnvironment(new LeaveGroup);

#define REQUIRE_MPIRUN()                                                                    \
  do {                                                                                      \
    if (!mpi_available() || !launched_by_mpirun())                                          \
      GTEST_SKIP() << "runs under mpirun (ctest: tensor_parallel_mpi_2, _4)";               \
  } while (0)

TensorParallelConfig world_config() {
  auto world = init_process_group("mpi");
  TensorParallelConfig tp;
  tp.mesh = init_device_mesh(DeviceType::cpu, *world);
  tp.group = world;
  return tp;
}

// Restores strict eager after a test that switched modes.
struct ModeScope {
  explicit ModeScope(EagerMode m) : prev(eager_mode()) { set_eager_mode(m); }
  ~ModeScope() { set_eager_mode(prev); }
  EagerMode prev;
};

TEST(TensorParallelMpi, CollectivesSumGatherBroadcastInEveryMode) {
  REQUIRE_MPIRUN();
  const TensorParallelConfig tp = world_config();
  const int r = tp.group->rank(), n = tp.group->size();
  for (EagerMode mode : {EagerMode::DeferNever, EagerMode::DeferAndFuse}) {
    ModeScope scope(mode);
    // Rank r holds (r + 1) * [0, 1, 2, 3, 4, 5]: the sum is n(n+1)/2 times it.
    const Tensor x = arange_tensor({2, 3}) * double(r + 1);
    const auto sum = all_reduce(x * 1.0, tp.group).to_floats();
    for (size_t i = 0; i < sum.size(); ++i) EXPECT_EQ(sum[i], float(i) * n * (n + 1) / 2);
    // Gathered along dim 1: (2, 3n), block k of each row from rank k.
    const Tensor g = all_gather(x, 1, tp.group);
    ASSERT_EQ(g.shape(), (Shape{2, 3 * n}));
    const auto gv = g.to_floats();
    for (int k = 0; k < n; ++k)
      for (int row = 0; row < 2; ++row)
        for (int c = 0; c < 3; ++c)
          EXPECT_EQ(gv[size_t(row * 3 * n + k * 3 + c)], float((row * 3 + c) * (k + 1)));
  }
  uint64_t v = r == 0 ? 0x1234567890abcdefull : 0;
  tp.group->broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 0x1234567890abcdefull);
  tp.group->barrier();
}

// FLUX.1 forward() arguments at a 32x32 image (16 latent tokens), 8 text tokens: torch.randn
// draws from one seed, the same on every rank.
FluxTransformerInputs flux_inputs(const FluxTransformerConfig& c) {
  Generator gen(7);
  FluxTransformerInputs in;
  const int64_t img = 16, txt = 8;
  in.hidden_states = randn({1, img, c.in_channels}, DType::f32, gen);
  in.encoder_hidden_states = randn({1, txt, c.joint_attention_dim}, DType::f32, gen);
  in.pooled_projections = randn({1, c.pooled_projection_dim}, DType::f32, gen);
  in.timestep = Tensor::from_floats({0.75f}, {1});
  if (c.guidance_embeds) in.guidance = Tensor::from_floats({3.5f}, {1});
  std::vector<float> img_ids, txt_ids(size_t(txt * 3), 0.0f);
  for (int64_t i = 0; i < img; ++i) img_ids.insert(img_ids.end(), {0.0f, float(i / 4), float(i % 4)});
  in.img_ids = Tensor::from_floats(img_ids, {img, 3});
  in.txt_ids = Tensor::from_floats(txt_ids, {txt, 3});
  return in;
}

// The split model against the whole one, in strict eager, deferred, compiled and regional modes.
template <typename Model, typename Inputs>
void expect_tp_matches_whole(Model& whole, Model& split, const Inputs& in,
                             const std::string& what) {
  int sharded = 0;
  for (const auto& p : split.named_parameters()) sharded += p.shard.sharded();
  auto group = default_process_group();
  ASSERT_TRUE(group);
  if (group->size() > 1) ASSERT_GT(sharded, 0) << what << ": nothing was split";
  const Tensor expected = contiguous(whole.forward(in));
  for (const std::string mode : {"eager", "defer", "compile", "regional"}) {
    ModeScope scope(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    split.reset_compile();
    if (mode == "compile") split.compile();
    if (mode == "regional") split.compile_repeated_blocks();
    for (int call = 0; call < 2; ++call) {  // the second call replays the cached segment/program
      const int64_t before = group->collectives();
      const Tensor got = contiguous(split.forward(in));
      if (group->size() > 1) EXPECT_GT(group->collectives(), before) << what << " " << mode;
      ASSERT_EQ(got.shape(), expected.shape());
      EXPECT_LE(relative_error(got, expected), 1e-5) << what << " " << mode << " call " << call;
    }
    split.reset_compile();
  }
}

TEST(TensorParallelMpi, FluxFixturesMatchTheWholeModelInEveryMode) {
  REQUIRE_MPIRUN();
  const TensorParallelConfig tp = world_config();
  for (const char* folder : {"flux1-schnell-tiny/transformer", "flux1-dev-tiny/transformer"}) {
    if (!has_fixture(std::string(folder) + "/config.json")) GTEST_SKIP() << folder << " missing";
    auto whole = FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32);
    if (whole->config.num_attention_heads % tp.degree() != 0) {
      // 2 heads: 4 ranks is a clear error (TensorParallel.HeadsTheDegreeDoesNotDivide...);
      // FluxWithFourHeads below covers 4 ranks.
      EXPECT_NE(error_message([&] {
                  FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
                }).find("not divisible"),
                std::string::npos);
      continue;
    }
    auto split = FluxTransformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
    expect_tp_matches_whole(*whole, *split, flux_inputs(whole->config), folder);
  }
}

// A FLUX.1 transformer with 4 heads of 8 and random weights (the same on every rank), for 4
// ranks: the fixtures' 2 heads split over 2 at most.
TEST(TensorParallelMpi, FluxWithFourHeadsMatchesTheWholeModelInEveryMode) {
  REQUIRE_MPIRUN();
  const TensorParallelConfig tp = world_config();
  FluxTransformerConfig c;
  c.in_channels = c.out_channels = 16;
  c.num_layers = 2;
  c.num_single_layers = 2;
  c.attention_head_dim = 8;
  c.num_attention_heads = 4;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 12;
  c.guidance_embeds = true;
  c.axes_dims_rope = {2, 2, 4};
  FluxTransformer2DModel whole(c), split(c);
  Generator gen(11);
  std::map<std::string, Tensor> weights;
  for (const auto& p : whole.named_parameters())
    weights[p.name] = randn(p.full_shape, DType::f32, gen) * 0.2;
  const MapWeightSource source(weights, "random FLUX weights");
  LoadOptions opt;
  whole.load_weights(source, opt);
  parallelize_module(split, split.tp_plan(), tp, "[FluxTransformer2DModel]");
  split.load_weights(source, opt);
  expect_tp_matches_whole(whole, split, flux_inputs(whole.config), "4 heads");
}

// FLUX.2's fixture (4 heads, SwiGLU MLPs, fused single-block projections) on 2 and 4 ranks.
TEST(TensorParallelMpi, Flux2FixtureMatchesTheWholeModelInEveryMode) {
  REQUIRE_MPIRUN();
  const char* folder = "flux2-dev-tiny/transformer";
  if (!has_fixture(std::string(folder) + "/config.json")) GTEST_SKIP() << folder << " missing";
  const TensorParallelConfig tp = world_config();
  auto whole = Flux2Transformer2DModel::from_pretrained(fixture_path(folder), DType::f32);
  auto split = Flux2Transformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
  const Flux2TransformerConfig& c = whole->config;
  Generator gen(9);
  Flux2TransformerInputs in;
  const int64_t img = 16, txt = 8;
  in.hidden_states = randn({1, img, c.in_channels}, DType::f32, gen);
  in.encoder_hidden_states = randn({1, txt, c.joint_attention_dim}, DType::f32, gen);
  in.timestep = Tensor::from_floats({0.6f}, {1});
  in.guidance = Tensor::from_floats({4.0f}, {1});
  std::vector<float> img_ids, txt_ids;
  for (int64_t i = 0; i < img; ++i) img_ids.insert(img_ids.end(), {0.0f, float(i / 4), float(i % 4), 0.0f});
  for (int64_t i = 0; i < txt; ++i) txt_ids.insert(txt_ids.end(), {0.0f, 0.0f, 0.0f, float(i)});
  in.img_ids = Tensor::from_floats(img_ids, {img, 4});
  in.txt_ids = Tensor::from_floats(txt_ids, {txt, 4});
  expect_tp_matches_whole(*whole, *split, in, folder);
}

// SD3.5-medium's fixture (joint and dual attention, the context-pre-only last block): 2 heads, so
// 2 ranks; on 4 the heads check refuses it.
TEST(TensorParallelMpi, Sd3FixtureMatchesTheWholeModelInEveryMode) {
  REQUIRE_MPIRUN();
  const char* folder = "sd35-medium-tiny/transformer";
  if (!has_fixture(std::string(folder) + "/config.json")) GTEST_SKIP() << folder << " missing";
  const TensorParallelConfig tp = world_config();
  auto whole = SD3Transformer2DModel::from_pretrained(fixture_path(folder), DType::f32);
  const SD3TransformerConfig& c = whole->config;
  if (c.num_attention_heads % tp.degree() != 0) {
    EXPECT_NE(error_message([&] {
                SD3Transformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
              }).find("num_attention_heads=2 is not divisible"),
              std::string::npos);
    return;
  }
  auto split = SD3Transformer2DModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
  Generator gen(13);
  SD3TransformerInputs in;
  in.hidden_states = randn({1, c.in_channels, 8, 8}, DType::f32, gen);
  in.encoder_hidden_states = randn({1, 8, c.joint_attention_dim}, DType::f32, gen);
  in.pooled_projections = randn({1, c.pooled_projection_dim}, DType::f32, gen);
  in.timestep = Tensor::from_floats({500.0f}, {1});
  expect_tp_matches_whole(*whole, *split, in, folder);
}

// ---- tessera launch -----------------------------------------------------------------------

struct ShellRun {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

// Runs `command` through the shell, stdout and stderr together.
ShellRun shell(const std::string& command) {
  ShellRun r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) r.output += buf;
  const int status = p ? pclose(p) : -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TensorParallelLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_available()) GTEST_SKIP() << "built without MPI";
    dir_ = std::filesystem::temp_directory_path() /
           ("tessera-tp-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string generate_args(const std::string& model, const std::string& extra,
                            int steps = 2) const {
    return std::string(" generate --model ") + fixture_path(model) +
           " --prompt 'a red circle' --height 64 --width 64 --steps " + std::to_string(steps) +
           " --seed 5 --max-sequence-length 16 " + extra;
  }
  std::filesystem::path dir_;
};

const std::string kCli = TESSERA_CLI_PATH;

// The checkpoint bytes of the transformer tensors that `ranks` ranks split.
template <typename Model>
int64_t split_checkpoint_bytes(const std::string& transformer, int ranks) {
  const CheckpointReader ckpt = CheckpointReader::open(transformer);
  const TensorParallelConfig tp = stand_in(0, ranks);
  const auto shaped = Model::from_pretrained(transformer, DType::f32, &tp);
  int64_t bytes = 0;
  for (const auto& p : shaped->named_parameters())
    if (p.shard.sharded()) {
      const SafetensorsEntry& e = ckpt.entry(p.name);
      bytes += int64_t(e.end - e.begin);
    }
  return bytes;
}

// tessera launch with --tp N against tessera generate: the same picture, and each rank reading
// the replicated weights and 1/N of the split ones.
void expect_launch_matches_tp1(const std::filesystem::path& dir, const std::string& model,
                               const std::string& mode, int ranks,
                               const std::function<std::string(const std::string&)>& args) {
  const std::string one = (dir / (model + mode + "-1.png")).string();
  const std::string many = (dir / (model + mode + "-n.png")).string();
  const std::string r1 = (dir / "r1.json").string(), rn = (dir / "rn.json").string();
  const ShellRun a = shell(kCli + args("--mode " + mode + " --output " + one + " --report " + r1));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const ShellRun b = shell(kCli + " launch --nproc-per-node " + std::to_string(ranks) + " --" +
                           args("--mode " + mode + " --tp " + std::to_string(ranks) +
                                " --output " + many + " --report " + rn));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // The same picture: the split model's partial sums add up in another order (f32 within
  // 1e-5, TensorParallelMpi above), which can move a pixel across a rounding boundary of
  // x * 255; at most one level on at most 0.1% of the values, else the PNG bytes are equal.
  const PngImage pa = read_png(one), pb = read_png(many);
  ASSERT_EQ(pa.rgb.size(), pb.rgb.size());
  size_t differ = 0;
  int worst = 0;
  for (size_t i = 0; i < pa.rgb.size(); ++i) {
    const int d = std::abs(int(pa.rgb[i]) - int(pb.rgb[i]));
    differ += d != 0;
    worst = std::max(worst, d);
  }
  EXPECT_LE(worst, 1) << model << " " << mode;
  EXPECT_LE(double(differ), 1e-3 * double(pa.rgb.size())) << model << " " << mode;
  if (differ == 0)
    EXPECT_TRUE(read_bytes(one) == read_bytes(many)) << model << " " << mode << ": same pixels";
  std::printf("%s %s TP=%d: %zu of %zu values differ (by 1)\n", model.c_str(), mode.c_str(),
              ranks, differ, pa.rgb.size());
  const auto j1 = nlohmann::json::parse(read_bytes(r1));
  const auto jn = nlohmann::json::parse(read_bytes(rn));
  ASSERT_EQ(jn["tensor_parallel"]["degree"], ranks);
  EXPECT_GT(jn["tensor_parallel"]["collectives"].get<int64_t>(), 0);
  const int64_t whole = j1["memory"]["stages"]["load"]["disk_read_bytes"];
  const std::string transformer = fixture_path(model + "/transformer");
  const int64_t split =
      model.rfind("flux2", 0) == 0 ? split_checkpoint_bytes<Flux2Transformer2DModel>(transformer, ranks)
      : model.rfind("sd35", 0) == 0 ? split_checkpoint_bytes<SD3Transformer2DModel>(transformer, ranks)
                                    : split_checkpoint_bytes<FluxTransformer2DModel>(transformer, ranks);
  ASSERT_GT(split, 0);
  const double bound = double(whole - split + split / ranks) * 1.05;
  for (int64_t read : jn["tensor_parallel"]["checkpoint_read_bytes"]) {
    EXPECT_LT(read, whole);
    EXPECT_LE(double(read), bound) << model << " whole " << whole << " split " << split;
  }
  for (int64_t peak : jn["tensor_parallel"]["peak_weight_bytes"])
    EXPECT_LT(peak, j1["memory"]["stages"]["load"]["peak_weight_bytes"].get<int64_t>());
}

TEST_F(TensorParallelLaunch, TwoRanksWriteTheSamePictureAsOneAndReadHalfTheSplitWeights) {
  for (const char* model :
       {"flux1-schnell-tiny", "flux1-dev-tiny", "flux2-dev-tiny", "sd35-medium-tiny"}) {
    if (!has_fixture(std::string(model) + "/model_index.json")) GTEST_SKIP() << model << " missing";
    for (const std::string mode : {"eager", "defer", "compile"})
      expect_launch_matches_tp1(dir_, model, mode, 2,
                                [&](const std::string& extra) { return generate_args(model, extra); });
  }
}

// FLUX.2's fixture has 4 heads: 4 ranks (oversubscribed on small machines).
TEST_F(TensorParallelLaunch, FourRanksWriteTheSamePictureAsOne) {
  const char* model = "flux2-dev-tiny";
  if (!has_fixture(std::string(model) + "/model_index.json")) GTEST_SKIP() << model << " missing";
  expect_launch_matches_tp1(dir_, model, "eager", 4,
                            [&](const std::string& extra) { return generate_args(model, extra); });
}

TEST_F(TensorParallelLaunch, FourRanksOnTwoHeadsIsAClearError) {
  if (!has_fixture("flux1-schnell-tiny/model_index.json")) GTEST_SKIP() << "fixture missing";
  const ShellRun r = shell(kCli + " launch --nproc-per-node 4 --" +
                      generate_args("flux1-schnell-tiny", "--tp 4 --output " +
                                                              (dir_ / "x.png").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("num_attention_heads=2 is not divisible by the tensor-parallel degree 4"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.png"));
}

TEST_F(TensorParallelLaunch, TpWithoutLaunchIsAClearError) {
  const ShellRun r = shell(kCli + generate_args("flux1-schnell-tiny", "--tp 2 --output " +
                                                                     (dir_ / "x.png").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("start it with tessera launch --nproc-per-node 2"), std::string::npos)
      << r.output;
}

// The ranks of the newest run started from `launch_pid`'s mpirun: pid per OMPI rank.
std::map<int, pid_t> rank_pids() {
  std::map<int, pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = read_bytes(e.path().string() + "/cmdline");
    if (cmd.find(kCli) != 0 || cmd.find(std::string("generate\0", 9)) == std::string::npos ||
        cmd.find("tp-kill") == std::string::npos)
      continue;
    const std::string env = read_bytes(e.path().string() + "/environ");
    const size_t at = env.find("OMPI_COMM_WORLD_RANK=");
    if (at == std::string::npos) continue;
    out[std::atoi(env.c_str() + at + 21)] = pid_t(std::stol(name));
  }
  return out;
}

TEST_F(TensorParallelLaunch, KillingOneRankStopsEveryRankNamingIt) {
  if (!has_fixture("flux1-schnell-tiny/model_index.json")) GTEST_SKIP() << "fixture missing";
  const std::string log = (dir_ / "log.txt").string();
  // Long enough to be killed mid-denoising (thousands of steps of the tiny model).
  const std::string cmd = kCli + " launch --nproc-per-node 2 --" +
                          generate_args("flux1-schnell-tiny",
                                        "--tp 2 --output " + (dir_ / "tp-kill.png").string(),
                                        5000) +
                          " > " + log + " 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    _exit(127);
  }
  // Wait for denoising to start on rank 0 (its progress lines), then kill rank 1.
  std::map<int, pid_t> ranks;
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ranks = rank_pids();
    if (ranks.size() == 2 && read_bytes(log).find("step 3/") != std::string::npos) break;
  }
  ASSERT_EQ(ranks.size(), 2u) << read_bytes(log);
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  double waited = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (w == pid) break;
    if (waited > 60) {  // a hang: stop it, and fail below
      kill(ranks[0], SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string out = read_bytes(log);
  EXPECT_LE(waited, 30.0) << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_NE(out.find("[rank 0] rank 1 failed"), std::string::npos) << out;
  EXPECT_TRUE(rank_pids().empty()) << "a rank is still running";
  EXPECT_FALSE(std::filesystem::exists(dir_ / "tp-kill.png"));
}

}  // namespace
}  // namespace tessera
