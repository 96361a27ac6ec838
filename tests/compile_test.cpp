// Compiled mode and regional compilation against strict eager (bit for bit: fusion keeps every
// rounding point), and their structure: programs per signature, cache hits, graph breaks, the
// on-disk plan cache.
#include "runtime/compile.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io_test_folder.h"
#include "models/flux_transformer.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/norm.h"
#include "pipelines/flux_pipeline.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "test_util.h"

namespace tessera {
namespace {

// The statistics are per process and say "compile" once a program ran since the last reset:
// after any test that ran one (TESSERA_COMPILE runs every model test so), reset them.
class ResetStats : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override {
    if (mode_stats().compiled_runs > 0) reset_mode_stats();
  }
};
const bool kListener = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new ResetStats);
  return true;
}();

Tensor rnd(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(s, dt, g);
}

// A small block: matmul, norm -> modulate -> activation chain, residual.
std::vector<Tensor> small_block(const std::vector<Tensor>& in, const Tensor& w) {
  Tensor h = matmul(in[0], w);
  h = layer_norm(h, Tensor(), Tensor(), 1e-6) * (in[1] + 1.0) + in[1];
  return {silu(h) + in[0]};
}

TEST(Compile, SmallFunctionMatchesEagerAndReusesItsProgram) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor w = rnd({32, 32}, dt, 7);
    CompiledFunction f("small", {});
    auto fn = [&](const std::vector<Tensor>& in) { return small_block(in, w); };
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const std::vector<Tensor> in = {rnd({2, 5, 32}, dt, seed), rnd({2, 1, 32}, dt, seed + 10)};
      const Tensor ref = fn(in)[0];
      const Tensor got = f(in, fn)[0];
      EXPECT_TRUE(test::bit_equal(got, ref)) << dtype_name(dt) << " seed " << seed;
    }
    EXPECT_EQ(f.compiles(), 1);
    EXPECT_EQ(f.cache_hits(), 2);
    // A new shape compiles once; the old one is still cached.
    const std::vector<Tensor> other = {rnd({1, 7, 32}, dt, 4), rnd({1, 1, 32}, dt, 5)};
    EXPECT_TRUE(test::bit_equal(f(other, fn)[0], fn(other)[0]));
    f({rnd({2, 5, 32}, dt, 9), rnd({2, 1, 32}, dt, 8)}, fn);
    EXPECT_EQ(f.compiles(), 2);
    EXPECT_EQ(f.num_programs(), 2);
  }
}

TEST(Compile, DynamicShapesAreRefused) {
  CompileOptions o;
  o.dynamic = true;
  const std::string msg = test::error_message([&] { CompiledFunction f("f", o); });
  EXPECT_NE(msg.find("[compile] dynamic=true is not supported: static shapes only"),
            std::string::npos)
      << msg;
  o.dynamic = false;
  o.backend = "metal";  // no such backend ("tpu" and "xla" exist where the XLA backend is built)
  EXPECT_NE(test::error_message([&] { CompiledFunction f("f", o); }).find("backend 'metal'"),
            std::string::npos);
}

TEST(Compile, HostReadInsideTheTraceIsAGraphBreak) {
  auto fn = [](const std::vector<Tensor>& in) {
    const Tensor s = exp(in[0]);
    return std::vector<Tensor>{s * s.item()};  // data-dependent: needs the value on the host
  };
  const std::vector<Tensor> in = {Tensor::from_floats({0.5f}, {1})};
  CompiledFunction strict("f", {});
  const std::string msg = test::error_message([&] { strict(in, fn); });
  EXPECT_NE(msg.find("[compile] f: forward reads a traced tensor on the host at the output of op "
                     "'exp'"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("compiled mode needs the whole forward as one graph"), std::string::npos);
  // fullgraph=false: that signature runs eagerly.
  CompiledFunction lenient("f", {.fullgraph = false});
  EXPECT_TRUE(test::bit_equal(lenient(in, fn)[0], fn(in)[0]));
}

TEST(Compile, OutputsMayBeInputsConstantsOrViews) {
  const Tensor c = rnd({3}, DType::f32, 3);
  CompiledFunction f("f", {});
  auto fn = [&](const std::vector<Tensor>& in) {
    const Tensor y = in[0] * 2.0;
    return std::vector<Tensor>{in[0], c, y.slice(0, 1, 3), Tensor(), y};
  };
  const Tensor x = rnd({4, 3}, DType::f32, 1);
  for (int i = 0; i < 2; ++i) {
    const auto out = f({x}, fn);
    EXPECT_TRUE(test::bit_equal(out[0], x));
    EXPECT_TRUE(test::bit_equal(out[1], c));
    EXPECT_TRUE(test::bit_equal(out[2], (x * 2.0).slice(0, 1, 3)));
    EXPECT_FALSE(out[3].defined());
    EXPECT_TRUE(test::bit_equal(out[4], x * 2.0));
  }
}

// The tiny FLUX transformer and golden inputs.
struct Flux {
  std::unique_ptr<FluxTransformer2DModel> model;
  std::map<std::string, Tensor> in;
  FluxTransformerInputs inputs(float t) const {
    FluxTransformerInputs x{in.at("hidden_states"),
                            in.at("encoder_hidden_states"),
                            in.at("pooled_projections"),
                            Tensor(),
                            in.at("img_ids"),
                            in.at("txt_ids")};
    const int64_t b = x.hidden_states.dim(0);
    x.timestep =
        Tensor::from_floats(std::vector<float>(size_t(b), t), {b}, in.at("timestep").dtype());
    return x;
  }
};

Flux load_flux(DType dt) {
  const std::string golden =
      "goldens/flux1-schnell-tiny/components/transformer/" + std::string(dtype_name(dt)) + "/";
  Flux f;
  f.model = FluxTransformer2DModel::from_pretrained(
      test::fixture_path("flux1-schnell-tiny/transformer"), dt);
  f.model->reset_compile();  // whatever TESSERA_COMPILE asked for
  f.in = test::load_fixture(golden + "inputs.safetensors");
  return f;
}

// Another image size: (L_img, 3) ids and random latents.
FluxTransformerInputs resized(const Flux& f, float t, int64_t tokens) {
  FluxTransformerInputs x = f.inputs(t);
  x.hidden_states = rnd({x.hidden_states.dim(0), tokens, 64}, x.hidden_states.dtype(), 11);
  std::vector<float> ids(size_t(tokens) * 3, 0.f);
  for (int64_t i = 0; i < tokens; ++i) ids[size_t(i) * 3 + 1] = float(i);
  x.img_ids = Tensor::from_floats(ids, {tokens, 3});
  return x;
}

class CompileFlux : public ::testing::TestWithParam<DType> {};

TEST_P(CompileFlux, FullCompileCompilesOncePerSizeAndMatchesEager) {
  Flux f = load_flux(GetParam());
  const float ts[] = {1.0f, 0.75f, 0.5f, 0.25f};
  std::vector<Tensor> ref;
  for (float t : ts) ref.push_back(f.model->forward(f.inputs(t)));
  f.model->compile();
  reset_mode_stats();
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(ts[i])), ref[i])) << "step " << i;
  ModeStats s = mode_stats();
  EXPECT_EQ(s.mode, "compile");
  EXPECT_EQ(s.program_compiles, 1);
  EXPECT_EQ(s.program_cache_hits, 3);
  EXPECT_GT(s.fused_kernels, 0);
  // "8 steps": other timesteps, same signature, nothing compiles.
  for (int i = 0; i < 8; ++i) f.model->forward(f.inputs(1.0f - float(i) / 8));
  EXPECT_EQ(mode_stats().program_compiles, 1);
  // A new size compiles once; going back compiles nothing.
  const Tensor big = f.model->forward(resized(f, 0.5f, 32));
  EXPECT_EQ(mode_stats().program_compiles, 2);
  EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(ts[0])), ref[0]));
  EXPECT_EQ(mode_stats().program_compiles, 2);
  EXPECT_EQ(f.model->compiled_programs().at("FluxTransformer2DModel"), 2);
  f.model->reset_compile();
  EXPECT_TRUE(test::bit_equal(big, f.model->forward(resized(f, 0.5f, 32))));
}

TEST_P(CompileFlux, LaterCallsAllocateLittleMoreThanTheirOutputs) {
  Flux f = load_flux(GetParam());
  auto allocations = [&] {
    const int64_t before = cpu_allocator().stats().alloc_count;
    f.model->forward(f.inputs(0.5f));
    return cpu_allocator().stats().alloc_count - before;
  };
  allocations();
  const int64_t eager = allocations();
  f.model->compile();
  allocations();
  const int64_t compiled = allocations();
  std::cout << "  allocations per call: eager " << eager << ", compiled " << compiled << "\n";
  EXPECT_LT(compiled * 4, eager);
}

TEST_P(CompileFlux, CaptureRunsAsItsOwnProgram) {
  Flux f = load_flux(GetParam());
  std::map<std::string, Tensor> ref_cap, cap;
  const Tensor ref = f.model->forward(f.inputs(0.5f), &ref_cap);
  f.model->compile();
  for (int i = 0; i < 2; ++i) {
    cap.clear();
    EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f), &cap), ref));
  }
  ASSERT_EQ(cap.size(), ref_cap.size());
  for (const auto& [name, t] : ref_cap) EXPECT_TRUE(test::bit_equal(cap.at(name), t)) << name;
  EXPECT_EQ(f.model->compiled_function()->compiles(), 1);
}

TEST_P(CompileFlux, RegionalBuildsOneProgramPerBlockClass) {
  Flux f = load_flux(GetParam());
  const Tensor ref = f.model->forward(f.inputs(0.5f));
  f.model->compile_repeated_blocks();
  reset_mode_stats();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  const auto programs = f.model->compiled_programs();
  ASSERT_EQ(programs.size(), 2u);
  EXPECT_EQ(programs.at("FluxTransformerBlock"), 1);
  EXPECT_EQ(programs.at("FluxSingleTransformerBlock"), 1);
  const ModeStats s = mode_stats();
  EXPECT_EQ(s.mode, "compile-regional");
  EXPECT_EQ(s.program_compiles, 2);
  const int64_t layers =
      int64_t(f.model->transformer_blocks.size() + f.model->single_transformer_blocks.size());
  EXPECT_EQ(s.program_cache_hits, 3 * layers - 2);
  // Weights are program inputs: changing a layer's weights (as offload does) needs no compile.
  Tensor& w = f.model->transformer_blocks[1]->ff.out.weight;
  const Tensor saved = w;
  w = clone(w * 0.5);
  const Tensor changed = f.model->forward(f.inputs(0.5f));
  EXPECT_EQ(mode_stats().program_compiles, 2);
  f.model->reset_compile();
  EXPECT_TRUE(test::bit_equal(changed, f.model->forward(f.inputs(0.5f))));
  w = saved;
  EXPECT_FALSE(test::bit_equal(changed, ref));
}

TEST_P(CompileFlux, FullCompileOverRegionalBlocksTracesThemInline) {
  Flux f = load_flux(GetParam());
  const Tensor ref = f.model->forward(f.inputs(0.5f));
  f.model->compile_repeated_blocks();
  f.model->compile();
  reset_mode_stats();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  EXPECT_EQ(mode_stats().program_compiles, 1);  // the whole model; the blocks are inside it
  EXPECT_EQ(f.model->compiled_programs().at("FluxTransformerBlock"), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CompileFlux, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CompileDiskCache, SecondProcessLoadsThePlan) {
  test::TempDir dir;
  set_compile_cache_dir(dir.path());
  Flux f = load_flux(DType::f32);
  const Tensor ref = f.model->forward(f.inputs(0.5f));
  f.model->compile();
  reset_mode_stats();
  EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  EXPECT_EQ(mode_stats().disk_cache_hits, 0);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  // "Second process": nothing in memory, the plan comes from disk.
  f.model->compile();
  EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  EXPECT_EQ(mode_stats().disk_cache_hits, 1);
  EXPECT_EQ(mode_stats().program_compiles, 2);
  // A corrupt file is ignored (one warning), planned again and rewritten.
  {
    std::fstream io(files[0], std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(60);
    io.write("#9#", 3);
  }
  f.model->compile();
  testing::internal::CaptureStderr();
  EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[compile] ignoring the plan cache file"), std::string::npos) << err;
  EXPECT_EQ(mode_stats().disk_cache_hits, 1);
  f.model->compile();
  EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  EXPECT_EQ(mode_stats().disk_cache_hits, 2);
  // A stale file (another version) is ignored the same way.
  {
    std::ofstream out(files[0], std::ios::binary | std::ios::trunc);
    out << "tessera-plan 0 0.0.0 0\nunits 0\n";
  }
  f.model->compile();
  testing::internal::CaptureStderr();
  EXPECT_TRUE(test::bit_equal(f.model->forward(f.inputs(0.5f)), ref));
  EXPECT_NE(testing::internal::GetCapturedStderr().find("another tessera version"),
            std::string::npos);
  set_compile_cache_dir("");
}

TEST(CompilePipeline, StepsShareOneProgram) {
  auto pipe = FluxPipeline::from_pretrained(test::fixture_path("flux1-schnell-tiny"));
  pipe->transformer->reset_compile();
  FluxCallOptions call;
  call.prompt = {"a red cube"};
  call.height = 64;
  call.width = 64;
  call.num_inference_steps = 4;
  call.seed = 3;
  call.max_sequence_length = 32;
  const PipelineOutput ref = (*pipe)(call);
  pipe->transformer->compile();
  reset_mode_stats();
  const PipelineOutput out = (*pipe)(call);
  EXPECT_TRUE(test::bit_equal(out.image, ref.image));
  EXPECT_EQ(mode_stats().program_compiles, 1);
  EXPECT_EQ(mode_stats().program_cache_hits, 3);
  call.num_inference_steps = 8;
  (*pipe)(call);
  EXPECT_EQ(mode_stats().program_compiles, 1);
  EXPECT_EQ(mode_stats().program_cache_hits, 11);
  call.height = 96;
  (*pipe)(call);
  EXPECT_EQ(mode_stats().program_compiles, 2);
  call.height = 64;
  (*pipe)(call);
  EXPECT_EQ(mode_stats().program_compiles, 2);
}

// The CLI: --compile / --compile-regional give eager's image and report what they did.
TEST(CompileCli, GenerateCompiledReportsItsModeAndMatchesEager) {
  for (const char* v : {"TESSERA_COMPILE", "TESSERA_DEFER_AND_FUSE"})
    if (std::getenv(v) && *std::getenv(v)) GTEST_SKIP() << v << " set: the child would inherit it";
  test::TempDir tmp;
  const std::string base = "generate --model " +
                           test::quote(test::fixture_path("flux1-schnell-tiny")) +
                           " --prompt 'a cube' --height 64 --width 64 --seed 2";
  std::map<std::string, std::string> pixels;
  for (const std::string flag : {"", "--compile", "--mode compile", "--compile-regional"}) {
    const std::string png = tmp / "out.png", report = tmp / "r.json";
    const auto r = test::run_cli(base + " " + flag + " -o " + test::quote(png) + " --report " +
                                 test::quote(report));
    ASSERT_EQ(r.code, 0) << flag << ": " << r.err;
    const auto modes = nlohmann::json::parse(test::read_text(report))["modes"];
    const std::string want =
        flag.empty() ? "eager" : (flag == "--compile-regional" ? "compile-regional" : "compile");
    EXPECT_EQ(modes["mode"], want) << flag;
    if (!flag.empty()) {
      EXPECT_EQ(modes["program_compiles"], flag == "--compile-regional" ? 2 : 1) << flag;
      EXPECT_GT(modes["program_cache_hits"].get<int64_t>(), 0) << flag;
    }
    pixels[flag] = test::read_text(png);
  }
  for (const auto& [flag, p] : pixels) EXPECT_EQ(p, pixels.at("")) << flag;
  const auto r =
      test::run_cli(base + " --compile --offload model -o " + test::quote(tmp / "x.png"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("use --compile-regional with --offload"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
