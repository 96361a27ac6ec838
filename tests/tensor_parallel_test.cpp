// Tensor parallelism (src/distributed, decision 0040). Three groups:
//  * TensorParallel.*      one process: shard specs, sliced reads, the FLUX.1, T5 and Mistral3
//                          plans' per-rank loading (a stand-in group gives the rank), clear
//                          errors;
//  * TensorParallelMpi.*   under mpirun (tests/tensor_parallel.cmake: 2 and 4 ranks; skipped
//                          elsewhere): collectives, and the transformers and text encoders split
//                          over every rank against the whole model in every execution mode;
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
#include "io/safetensors.h"
#include "models/flux2_transformer.h"
#include "models/flux_transformer.h"
#include "models/mistral3_text_model.h"
#include "models/sd3_transformer.h"
#include "models/t5_encoder.h"
#include "nn/tensor_parallel.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "split_parity.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::error_message;
using test::relative_error;
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
template <typename M>
struct RankLoadOf {
  std::unique_ptr<M> model;
  int64_t bytes_read = 0;
};
using RankLoad = RankLoadOf<FluxTransformer2DModel>;
class ByteCounter final : public LoadObserver {
 public:
  ByteCounter() : prev_(set_load_observer(this)) {}
  ~ByteCounter() override { set_load_observer(prev_); }
  void loaded(Tensor*, const Tensor& source, DType) override { bytes += int64_t(source.nbytes()); }
  int64_t bytes = 0;

 private:
  LoadObserver* prev_;
};
template <typename M = FluxTransformer2DModel>
RankLoadOf<M> load_rank(const std::string& folder, const TensorParallelConfig* tp) {
  ByteCounter counter;
  RankLoadOf<M> r;
  r.model = M::from_pretrained(folder, DType::f32, tp);
  r.bytes_read = counter.bytes;
  return r;
}

// The checkpoint bytes of the tensors a `ranks`-way split of `folder` shards (read through the
// model's own names: Mistral3's checkpoints use older ones).
template <typename M>
int64_t split_checkpoint_bytes(const std::string& folder, int ranks) {
  const auto checkpoint = CheckpointWeightSource::open(folder);
  std::unique_ptr<WeightSource> renamed;
  if constexpr (requires { M::weight_source(checkpoint); }) renamed = M::weight_source(checkpoint);
  const WeightSource& source = renamed ? *renamed : static_cast<const WeightSource&>(checkpoint);
  const TensorParallelConfig tp = stand_in(0, ranks);
  const auto shaped = M::from_pretrained(folder, DType::f32, &tp);
  int64_t bytes = 0;
  for (const auto& p : shaped->named_parameters())
    if (p.shard.sharded()) bytes += int64_t(source.get(p.name).nbytes());  // a view: not read
  return bytes;
}

// Every parameter a rank holds is its slice of the whole model's (read_shard) or, replicated,
// the whole one; returns how many are split (-1 after a mismatch of the lists, which fails here).
// A parameter both sides dropped after loading (T5's tied embed_tokens copy) is skipped.
int expect_params_are_slices_of(const std::vector<Module::Parameter>& part,
                                const std::vector<Module::Parameter>& whole) {
  EXPECT_EQ(part.size(), whole.size());
  if (part.size() != whole.size()) return -1;
  int split = 0;
  for (size_t i = 0; i < part.size(); ++i) {
    const auto& p = part[i];
    EXPECT_EQ(p.name, whole[i].name);
    if (p.name != whole[i].name) return -1;
    if (!p.slot->defined() && !whole[i].slot->defined()) continue;
    const Tensor expected = p.shard.sharded() ? read_shard(*whole[i].slot, p.shard) : *whole[i].slot;
    EXPECT_TRUE(test::bit_equal(contiguous(*p.slot), contiguous(expected))) << p.name;
    split += p.shard.sharded();
  }
  return split;
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
    const int split = expect_params_are_slices_of(part.model->named_parameters(), whole_params);
    // Per double block: 6 q/k/v, 2 attention outputs, 2 x (MLP in, its bias, MLP out) ... at
    // least one split per planned Linear.
    EXPECT_GT(split, 20);
  }
}

// Loading `M` from `fixture` split `degree` ways fails with an error containing `message`.
template <typename M>
void expect_degree_refused(const std::string& fixture, int degree, const std::string& message) {
  const TensorParallelConfig tp = stand_in(0, degree);
  const std::string msg =
      error_message([&] { M::from_pretrained(fixture_path(fixture), DType::f32, &tp); });
  EXPECT_NE(msg.find(message), std::string::npos) << msg;
}

TEST(TensorParallel, HeadsTheDegreeDoesNotDivideAreAClearError) {
  if (!has_fixture(std::string(kSchnell) + "/config.json")) GTEST_SKIP() << "fixture missing";
  // The tiny fixtures have 2 heads: 4 ranks cannot each hold whole heads.
  expect_degree_refused<FluxTransformer2DModel>(
      kSchnell, 4,
      "[FluxTransformer2DModel] num_attention_heads=2 is not divisible by the tensor-parallel "
      "degree 4");
}

// Each rank of a `ranks`-way split reads the replicated tensors and exactly 1/ranks of every
// split one, and holds the slice of the whole model's parameter.
template <typename M>
void expect_ranks_load_their_slices(const std::string& fixture, int ranks, int min_split) {
  const std::string folder = fixture_path(fixture);
  const RankLoadOf<M> whole = load_rank<M>(folder, nullptr);
  const int64_t sharded = split_checkpoint_bytes<M>(folder, ranks);
  ASSERT_GT(sharded, 0) << fixture;
  const auto whole_params = whole.model->named_parameters();
  for (int rank = 0; rank < ranks; ++rank) {
    const TensorParallelConfig tp = stand_in(rank, ranks);
    const RankLoadOf<M> part = load_rank<M>(folder, &tp);
    EXPECT_EQ(part.bytes_read, whole.bytes_read - sharded + sharded / ranks)
        << fixture << " rank " << rank << " of " << ranks;
    EXPECT_EQ(expect_params_are_slices_of(part.model->named_parameters(), whole_params), min_split)
        << fixture;
  }
}

const char* kT5 = "sd35-medium-tiny/text_encoder_3";
const char* kMistral = "flux2-dev-tiny/text_encoder";

TEST(TensorParallel, TextEncoderRanksLoadExactlyTheirSlices) {
  for (const char* f : {kT5, kMistral})
    if (!has_fixture(std::string(f) + "/config.json"))
      GTEST_SKIP() << "fixture " << f << " missing";
  // T5 (2 blocks): q, k, v, o, wi_0, wi_1, wo per block and the first block's bias table.
  for (int ranks : {2, 4}) expect_ranks_load_their_slices<T5EncoderModel>(kT5, ranks, 2 * 7 + 1);
  // Mistral3 (32 layers): q, k, v, o, gate, up, down per layer.
  expect_ranks_load_their_slices<Mistral3TextModel>(kMistral, 2, 32 * 7);
}

TEST(TensorParallel, KeyValueHeadsTheDegreeDoesNotDivideAreAClearError) {
  if (!has_fixture(std::string(kMistral) + "/config.json")) GTEST_SKIP() << "fixture missing";
  // 4 query heads but 2 key/value heads: 4 ranks would split a key/value head.
  expect_degree_refused<Mistral3TextModel>(
      kMistral, 4,
      "[Mistral3ForConditionalGeneration] num_key_value_heads=2 is not divisible by the "
      "tensor-parallel degree 4");
  // T5 with 4 heads refuses 8 ranks the same way.
  expect_degree_refused<T5EncoderModel>(
      kT5, 8, "[T5EncoderModel] num_heads=4 is not divisible by the tensor-parallel degree 8");
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

// The split model against the whole one, in strict eager, deferred, compiled and regional modes;
// `forward` runs a model on the test's inputs.
template <typename Model>
void expect_split_matches_whole(Model& whole, Model& split,
                                const std::function<Tensor(const Model&)>& forward,
                                const std::string& what) {
  int sharded = 0;
  for (const auto& p : split.named_parameters()) sharded += p.shard.sharded();
  auto group = default_process_group();
  ASSERT_TRUE(group);
  if (group->size() > 1) ASSERT_GT(sharded, 0) << what << ": nothing was split";
  const Tensor expected = contiguous(forward(whole));
  for (const std::string mode : {"eager", "defer", "compile", "regional"}) {
    if (mode == "regional" && split.repeated_blocks().empty()) continue;  // T5: none listed
    ModeScope scope(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    split.reset_compile();
    if (mode == "compile") split.compile();
    if (mode == "regional") split.compile_repeated_blocks();
    for (int call = 0; call < 2; ++call) {  // the second call replays the cached segment/program
      const int64_t before = group->collectives();
      const Tensor got = contiguous(forward(split));
      if (group->size() > 1) EXPECT_GT(group->collectives(), before) << what << " " << mode;
      ASSERT_EQ(got.shape(), expected.shape());
      EXPECT_LE(relative_error(got, expected), 1e-5) << what << " " << mode << " call " << call;
    }
    split.reset_compile();
  }
}

template <typename Model, typename Inputs>
void expect_tp_matches_whole(Model& whole, Model& split, const Inputs& in,
                             const std::string& what) {
  expect_split_matches_whole<Model>(
      whole, split, [&](const Model& m) { return m.forward(in); }, what);
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
    expect_tp_matches_whole(*whole, *split, test::seeded_flux_inputs(whole->config), folder);
  }
}

// A FLUX.1 transformer with 4 heads of 8 and random weights (the same on every rank), for 4
// ranks: the fixtures' 2 heads split over 2 at most.
TEST(TensorParallelMpi, FluxWithFourHeadsMatchesTheWholeModelInEveryMode) {
  REQUIRE_MPIRUN();
  const TensorParallelConfig tp = world_config();
  const FluxTransformerConfig c = test::four_head_flux_config();
  FluxTransformer2DModel whole(c), split(c);
  const MapWeightSource source(test::seeded_weights(whole, 11, 0.2), "random FLUX weights");
  LoadOptions opt;
  whole.load_weights(source, opt);
  parallelize_module(split, split.tp_plan(), tp, "[FluxTransformer2DModel]");
  split.load_weights(source, opt);
  expect_tp_matches_whole(whole, split, test::seeded_flux_inputs(whole.config), "4 heads");
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

// (1, 12) token ids below `vocab` from one seed (the same on every rank), and a mask whose last 3
// tokens are padding.
std::pair<Tensor, Tensor> encoder_inputs(int64_t vocab) {
  Generator gen(21);
  const auto u = rand({1, 12}, DType::f32, gen).to_floats();
  std::vector<int64_t> ids, mask;
  for (float x : u) ids.push_back(int64_t(x * float(vocab - 1)));
  for (int i = 0; i < 12; ++i) mask.push_back(i < 9 ? 1 : 0);
  return {Tensor::from_ints(ids, {1, 12}), Tensor::from_ints(mask, {1, 12})};
}

// T5 (SD3.5's text_encoder_3, FLUX.1's text_encoder_2; 4 heads): 2 and 4 ranks, with and without
// a padding mask.
TEST(TensorParallelMpi, T5FixturesMatchTheWholeEncoderInEveryMode) {
  REQUIRE_MPIRUN();
  const TensorParallelConfig tp = world_config();
  for (const char* folder : {"sd35-medium-tiny/text_encoder_3", "flux1-dev-tiny/text_encoder_2"}) {
    if (!has_fixture(std::string(folder) + "/config.json")) GTEST_SKIP() << folder << " missing";
    auto whole = T5EncoderModel::from_pretrained(fixture_path(folder), DType::f32);
    auto split = T5EncoderModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
    const auto [ids, mask] = encoder_inputs(whole->config.vocab_size);
    expect_split_matches_whole<T5EncoderModel>(
        *whole, *split, [&](const T5EncoderModel& m) { return m.forward(ids).last_hidden_state; },
        folder);
    T5EncoderForwardOptions masked;
    masked.attention_mask = mask;
    expect_split_matches_whole<T5EncoderModel>(
        *whole, *split,
        [&](const T5EncoderModel& m) { return m.forward(ids, nullptr, masked).last_hidden_state; },
        std::string(folder) + " masked");
  }
}

// What Flux2Pipeline reads (hidden states 10, 20, 30) and the whole forward's final norm, with
// padding.
Tensor mistral_outputs(const Mistral3TextModel& m, const Tensor& ids, const Tensor& mask) {
  const Tensor embeds = m.prompt_embeds(ids, mask, {10, 20, 30});
  return concat({embeds, m.forward(ids, mask).hidden_states.back()}, 2);
}

// FLUX.2's Mistral3 fixture: 4 query heads, 2 key/value heads, so 2 ranks; 4 is a clear error.
TEST(TensorParallelMpi, Mistral3FixtureMatchesTheWholeEncoderInEveryMode) {
  REQUIRE_MPIRUN();
  const char* folder = "flux2-dev-tiny/text_encoder";
  if (!has_fixture(std::string(folder) + "/config.json")) GTEST_SKIP() << folder << " missing";
  const TensorParallelConfig tp = world_config();
  auto whole = Mistral3TextModel::from_pretrained(fixture_path(folder), DType::f32);
  if (whole->config().num_key_value_heads % tp.degree() != 0) {
    EXPECT_NE(error_message([&] {
                Mistral3TextModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
              }).find("num_key_value_heads=2 is not divisible by the tensor-parallel degree"),
              std::string::npos);
    return;
  }
  auto split = Mistral3TextModel::from_pretrained(fixture_path(folder), DType::f32, &tp);
  const auto [ids, mask] = encoder_inputs(whole->config().vocab_size);
  expect_split_matches_whole<Mistral3TextModel>(
      *whole, *split, [&](const Mistral3TextModel& m) { return mistral_outputs(m, ids, mask); },
      folder);
}

// A Mistral3 text model with 8 query and 4 key/value heads (two queries per key/value head) and
// random weights, the same on every rank: grouped-query attention split over 4 ranks too.
TEST(TensorParallelMpi, Mistral3WithFourKeyValueHeadsMatchesTheWholeModelInEveryMode) {
  REQUIRE_MPIRUN();
  const TensorParallelConfig tp = world_config();
  Mistral3TextConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 8;
  Mistral3TextModel whole(c), split(c);
  const MapWeightSource source(test::seeded_weights(whole, 17, 0.3), "random Mistral3 weights");
  LoadOptions opt;
  whole.load_weights(source, opt);
  parallelize_module(split, split.tp_plan(), tp, Mistral3TextModel::kPretrainedName);
  split.load_weights(source, opt);
  const auto [ids, mask] = encoder_inputs(c.vocab_size);
  expect_split_matches_whole<Mistral3TextModel>(
      whole, split,
      [&](const Mistral3TextModel& m) {
        return concat(
            {m.prompt_embeds(ids, mask, {1, 2}), m.forward(ids, mask).hidden_states.back()}, 2);
      },
      "8 heads, 4 key/value heads");
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
    return generate_args_at(fixture_path(model), extra, steps);
  }
  std::string generate_args_at(const std::string& folder, const std::string& extra,
                               int steps = 2) const {
    return std::string(" generate --model ") + folder +
           " --prompt 'a red circle' --height 64 --width 64 --steps " + std::to_string(steps) +
           " --seed 5 --max-sequence-length 16 " + extra;
  }
  std::filesystem::path dir_;
};

const std::string kCli = TESSERA_CLI_PATH;

// The components a pipeline fixture splits under --tp (CLIP and the VAE stay whole) and the
// checkpoint bytes `ranks` ranks split of each.
std::map<std::string, int64_t> split_components(const std::string& model, const std::string& folder,
                                                int ranks) {
  const auto at = [&](const char* c) { return folder + "/" + c; };
  if (model.rfind("flux2", 0) == 0)
    return {
        {"transformer", split_checkpoint_bytes<Flux2Transformer2DModel>(at("transformer"), ranks)},
        {"text_encoder", split_checkpoint_bytes<Mistral3TextModel>(at("text_encoder"), ranks)}};
  if (model.rfind("sd35", 0) == 0)
    return {
        {"transformer", split_checkpoint_bytes<SD3Transformer2DModel>(at("transformer"), ranks)},
        {"text_encoder_3", split_checkpoint_bytes<T5EncoderModel>(at("text_encoder_3"), ranks)}};
  return {{"transformer", split_checkpoint_bytes<FluxTransformer2DModel>(at("transformer"), ranks)},
          {"text_encoder_2", split_checkpoint_bytes<T5EncoderModel>(at("text_encoder_2"), ranks)}};
}

// tessera launch with --tp N against tessera generate: the same picture, and each rank reading
// the replicated weights and 1/N of the split ones.
// `folder`: the pipeline folder (default: the fixture `model`).
void expect_launch_matches_tp1(const std::filesystem::path& dir, const std::string& model,
                               const std::string& mode, int ranks,
                               const std::function<std::string(const std::string&)>& args,
                               std::string folder = "", const std::string& launch_flags = "") {
  if (folder.empty()) folder = fixture_path(model);
  const std::string one = (dir / (model + mode + "-1.png")).string();
  const std::string many = (dir / (model + mode + "-n.png")).string();
  const std::string r1 = (dir / "r1.json").string(), rn = (dir / "rn.json").string();
  const ShellRun a = shell(kCli + args("--mode " + mode + " --output " + one + " --report " + r1));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const ShellRun b = shell(kCli + " launch --nproc-per-node " + std::to_string(ranks) +
                           launch_flags + " --" +
                           args("--mode " + mode + " --tp " + std::to_string(ranks) +
                                " --output " + many + " --report " + rn));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // The same picture (test::expect_same_picture), and when no value differs the same PNG bytes.
  const test::PictureDiff diff = test::expect_same_picture(one, many, model + " " + mode);
  if (diff.differ == 0)
    EXPECT_TRUE(read_bytes(one) == read_bytes(many)) << model << " " << mode << ": same pixels";
  std::printf("%s %s TP=%d: %zu of %zu values differ (by 1)\n", model.c_str(), mode.c_str(),
              ranks, diff.differ, diff.values);
  const auto j1 = nlohmann::json::parse(read_bytes(r1));
  const auto jn = nlohmann::json::parse(read_bytes(rn));
  ASSERT_EQ(jn["tensor_parallel"]["degree"], ranks);
  EXPECT_GT(jn["tensor_parallel"]["collectives"].get<int64_t>(), 0);
  const int64_t whole = j1["memory"]["stages"]["load"]["disk_read_bytes"];
  // Per component (the report's per-rank counts): the replicated ones read whole, the split ones
  // (the transformer and the T5 / Mistral3 encoder) at most 1/N of their split tensors + the rest
  // + 5%.
  const auto split_of = split_components(model, folder, ranks);
  int64_t split = 0;
  const auto& comps = jn["tensor_parallel"]["components"];
  ASSERT_EQ(comps.size(), j1["load_components"].size()) << model;
  for (const auto& [name, c] : comps.items()) {
    const int64_t one = j1["load_components"][name]["checkpoint_read_bytes"];
    const auto it = split_of.find(name);
    EXPECT_EQ(c["sharded"].get<bool>(), it != split_of.end()) << model << " " << name;
    const int64_t s = it == split_of.end() ? 0 : it->second;
    if (it != split_of.end()) ASSERT_GT(s, 0) << model << " " << name;
    split += s;
    const double bound_c = double(one - s + s / ranks) * 1.05;
    ASSERT_EQ(c["checkpoint_read_bytes"].size(), size_t(ranks));
    for (int64_t read : c["checkpoint_read_bytes"]) {
      EXPECT_LE(double(read), bound_c)
          << model << " " << name << " whole " << one << " split " << s;
      if (s > 0) EXPECT_LT(read, one) << model << " " << name;
    }
  }
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

// The several-hosts form, on this one host: MPI's host file names it, with two slots.
TEST_F(TensorParallelLaunch, HostFileWithThisHostWritesTheSamePictureAsOne) {
  const std::string hosts = (dir_ / "hosts").string();
  std::ofstream(hosts) << "localhost slots=2\n";
  expect_launch_matches_tp1(
      dir_, "flux1-schnell-tiny", "eager", 2,
      [&](const std::string& extra) { return generate_args("flux1-schnell-tiny", extra); }, "",
      " --hosts " + hosts);
}

// flux2-dev-tiny with its text encoder given 4 key/value heads (seeded random bf16 weights, the
// same config otherwise; the other components linked): the fixture's 2 stop the encoder at 2
// ranks, and its transformer's 4 heads allow 4.
std::filesystem::path flux2_with_four_kv_heads(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path src = fixture_path("flux2-dev-tiny"), out = dir / "flux2-dev-tiny-kv4";
  fs::create_directories(out / "text_encoder");
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "text_encoder")
      fs::create_symlink(e.path(), out / e.path().filename());
  auto cfg = nlohmann::json::parse(read_bytes((src / "text_encoder/config.json").string()));
  cfg["text_config"]["num_key_value_heads"] = 4;
  std::ofstream((out / "text_encoder/config.json").string()) << cfg.dump(2);
  const Mistral3TextModel shaped(
      Mistral3TextConfig::from_json(JsonConfig::load((out / "text_encoder/config.json").string())));
  Generator gen(23);
  std::map<std::string, Tensor> weights;
  for (const auto& p : shaped.named_parameters()) {
    Tensor w = randn(p.full_shape, DType::f32, gen) * 0.05;
    if (p.full_shape.size() == 1) w = w + 1.0;  // norm scales near 1
    weights[p.name] = astype(w, DType::bf16);
  }
  save_safetensors((out / "text_encoder/model.safetensors").string(), weights);
  return out;
}

// 4 ranks (oversubscribed on small machines): the FLUX.2 transformer (4 heads) and a Mistral3
// encoder with 4 key/value heads both split 4 ways.
TEST_F(TensorParallelLaunch, FourRanksWriteTheSamePictureAsOne) {
  if (!has_fixture("flux2-dev-tiny/model_index.json")) GTEST_SKIP() << "flux2-dev-tiny missing";
  const std::string folder = flux2_with_four_kv_heads(dir_).string();
  expect_launch_matches_tp1(
      dir_, "flux2-dev-tiny-kv4", "eager", 4,
      [&](const std::string& extra) { return generate_args_at(folder, extra); }, folder);
}

// The fixture's own encoder (2 key/value heads) refuses 4 ranks, naming why.
TEST_F(TensorParallelLaunch, FourRanksOnTwoKeyValueHeadsIsAClearError) {
  if (!has_fixture("flux2-dev-tiny/model_index.json")) GTEST_SKIP() << "fixture missing";
  const ShellRun r =
      shell(kCli + " launch --nproc-per-node 4 --" +
            generate_args("flux2-dev-tiny", "--tp 4 --output " + (dir_ / "x.png").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("[Mistral3ForConditionalGeneration] num_key_value_heads=2 is not "
                          "divisible by the tensor-parallel degree 4"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.png"));
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
