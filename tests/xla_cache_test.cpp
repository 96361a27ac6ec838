// Executables on disk and ahead-of-time compilation on XLA devices (decisions 0045, 0046),
// through the CLI as a user runs it: a second process compiles nothing and gives the same image;
// damaged cache entries are recompiled with a warning; `tessera compile` writes the denoiser's
// program, which a later run loads instead of compiling; TPU topologies compile without a TPU
// when libtpu is installed (ctest entry xla_tpu_aot, skipped without it).
#include <gtest/gtest.h>

#ifdef TESSERA_HAS_XLA
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/xla/pjrt_client.h"
#include "io_test_folder.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::quote;
using test::run_cli;
using test::TempDir;

bool have_cpu_plugin() {
  const char* p = std::getenv("TESSERA_PJRT_PLUGIN");
  return !(p && std::string(p) == "none") && !xla::default_plugin_path("cpu").empty();
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

std::string tiny() { return quote(test::fixture_path("flux1-schnell-tiny")); }

// Runs the CLI with one environment variable set (the child inherits it).
test::CliResult run_with(const char* var, const std::string& value, const std::string& args) {
  const char* old = std::getenv(var);
  const std::string saved = old ? old : "";
  setenv(var, value.c_str(), 1);
  auto r = run_cli(args);
  if (old)
    setenv(var, saved.c_str(), 1);
  else
    unsetenv(var);
  return r;
}

// The tiny FLUX.1 pipeline on xla:cpu, compiled mode, with `cache` as TESSERA_CACHE_DIR.
test::CliResult generate(const std::string& cache, const std::string& png,
                         const std::string& report) {
  return run_with("TESSERA_CACHE_DIR", cache,
                  "generate --model " + tiny() +
                      " --prompt 'a cat' --height 64 --width 64 --steps 2 --seed 0 --device "
                      "xla:cpu --mode compile -o " + quote(png) + " --report " + quote(report));
}

std::vector<fs::path> entries(const std::string& cache) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(cache) / "xla"))
    if (e.path().extension() == ".pjrt") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(XlaCache, SecondProcessCompilesNothingAndDamagedEntriesRecompile) {
  if (!have_cpu_plugin()) GTEST_SKIP() << "no XLA CPU plugin";
  TempDir tmp;
  const std::string cache = tmp / "cache";
  auto r = generate(cache, tmp / "a.png", tmp / "a.json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json a = read_json(tmp / "a.json")["xla"];
  EXPECT_GT(a["plugin_compiles"].get<int64_t>(), 10);
  EXPECT_EQ(a["disk_hits"].get<int64_t>(), 0);
  EXPECT_EQ(a["disk_writes"], a["plugin_compiles"]);
  const auto files = entries(cache);
  EXPECT_EQ(int64_t(files.size()), a["plugin_compiles"].get<int64_t>());

  // A second process: every executable comes from the disk, the image is the same bytes.
  r = generate(cache, tmp / "b.png", tmp / "b.json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json b = read_json(tmp / "b.json")["xla"];
  EXPECT_EQ(b["plugin_compiles"].get<int64_t>(), 0);
  EXPECT_EQ(b["disk_hits"], a["plugin_compiles"]);
  EXPECT_EQ(b["executables_needed"], a["executables_needed"]);
  EXPECT_EQ(test::read_text(tmp / "a.png"), test::read_text(tmp / "b.png"));

  // Damaged entries: truncated, a flipped payload byte, an empty file. Each is detected with
  // one warning line, recompiled and rewritten; the image does not change.
  ASSERT_GE(files.size(), 3u);
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);
  {
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  std::ofstream(files[2], std::ios::trunc).close();
  r = generate(cache, tmp / "c.png", tmp / "c.json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json c = read_json(tmp / "c.json")["xla"];
  EXPECT_EQ(c["plugin_compiles"].get<int64_t>(), 3);
  EXPECT_EQ(c["disk_rejected"].get<int64_t>(), 3);
  EXPECT_NE(r.err.find("ignoring the cached executable"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_text(tmp / "a.png"), test::read_text(tmp / "c.png"));
  // Rewritten: a fourth run loads all of them again.
  r = generate(cache, tmp / "d.png", tmp / "d.json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_json(tmp / "d.json")["xla"]["plugin_compiles"].get<int64_t>(), 0);
}

// `tessera compile --target xla:cpu` builds the transformer's program from the configs alone and
// writes it; a run at the same size then compiles one executable fewer than in an empty cache.
TEST(XlaAot, CompiledAheadOnXlaCpuThenLoadedByARun) {
  if (!have_cpu_plugin()) GTEST_SKIP() << "no XLA CPU plugin";
  TempDir tmp;
  auto r = run_cli("compile --model " + tiny() + " --target xla:cpu --height 64 --width 64 "
                   "--dtype f32 --cache-dir " + quote(tmp / "aot") + " --report " +
                   quote(tmp / "aot.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const json rep = read_json(tmp / "aot.json");
  ASSERT_EQ(rep["programs"].size(), 1u) << r.out;
  const json& p = rep["programs"][0];
  EXPECT_GT(p["ops"].get<int64_t>(), 100);
  EXPECT_TRUE(fs::exists(p["cache_file"].get<std::string>()));
  EXPECT_GT(p["serialized_bytes"].get<int64_t>(), 0);
  if (p["has_memory"].get<bool>())  // the weights are the program's arguments
    EXPECT_GE(p["argument_bytes"].get<int64_t>(), rep["parameter_bytes"].get<int64_t>());
  EXPECT_NE(r.out.find("program 0:"), std::string::npos) << r.out;

  r = generate(tmp / "empty", tmp / "a.png", tmp / "a.json");
  ASSERT_EQ(r.code, 0) << r.err;
  r = generate(tmp / "aot", tmp / "b.png", tmp / "b.json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json a = read_json(tmp / "a.json")["xla"], b = read_json(tmp / "b.json")["xla"];
  EXPECT_EQ(b["disk_hits"].get<int64_t>(), 1);
  EXPECT_EQ(b["plugin_compiles"].get<int64_t>(), a["plugin_compiles"].get<int64_t>() - 1);
  EXPECT_EQ(test::read_text(tmp / "a.png"), test::read_text(tmp / "b.png"));
}

TEST(XlaAot, BadTargetsAreOneLineErrors) {
  TempDir tmp;
  auto one_line = [](const test::CliResult& r, const std::string& what) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  one_line(run_cli("compile --model " + tiny() + " --target gpu:h100 --cache-dir " +
                   quote(tmp / "c")),
           "--target 'gpu:h100': expected tpu:<topology>");
  // No libtpu where it is said to be.
  one_line(run_with("TESSERA_LIBTPU_PATH", "/nonexistent/libtpu.so",
                    "compile --model " + tiny() + " --target tpu:v6e:1x1 --cache-dir " +
                        quote(tmp / "c")),
           "cannot load the PJRT plugin /nonexistent/libtpu.so");
  EXPECT_FALSE(fs::exists(fs::path(tmp / "c") / "xla"));
}

// libtpu without a TPU (ctest entry xla_tpu_aot, exit 77 without libtpu).
bool have_libtpu() { return !xla::default_plugin_path("tpu").empty(); }

TEST(XlaTpuAot, GenerateOnTpuSaysNoTpuFound) {
  if (!have_libtpu()) GTEST_SKIP() << "no libtpu";
  // (Other processes may have libtpu loaded: its one-process lock is not what this checks.)
  const auto r = run_with("ALLOW_MULTIPLE_LIBTPU_LOAD", "1",
                          "generate --model " + tiny() +
                              " --prompt 'a cat' --height 64 --width 64 --steps 1 --device tpu");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no TPU found"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(XlaTpuAot, TinyFluxCompilesForOneAndFourChipTopologies) {
  if (!have_libtpu()) GTEST_SKIP() << "no libtpu";
  TempDir tmp;
  for (const std::string topo : {"v6e:1x1", "v6e:2x2"}) {
    const auto r = run_cli("compile --model " + tiny() + " --target tpu:" + topo +
                           " --height 64 --width 64 --cache-dir " + quote(tmp / "c") +
                           " --report " + quote(tmp / "r.json"));
    ASSERT_EQ(r.code, 0) << r.err;
    const json rep = read_json(tmp / "r.json");
    ASSERT_EQ(rep["programs"].size(), 1u);
    const json& p = rep["programs"][0];
    EXPECT_NE(p["target"].get<std::string>().find(topo == "v6e:1x1" ? "1 x TPU" : "4 x TPU"),
              std::string::npos) << p["target"];
    EXPECT_TRUE(p["has_memory"].get<bool>());
    EXPECT_GE(p["argument_bytes"].get<int64_t>(), rep["parameter_bytes"].get<int64_t>());
    EXPECT_GT(fs::file_size(p["cache_file"].get<std::string>()), 1000u);
    EXPECT_EQ(rep["hbm_bytes"].get<int64_t>(), int64_t(32) << 30);
    EXPECT_TRUE(rep["fits"].get<bool>());  // a tiny model
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(fs::path(tmp / "c") / "xla"),
                          fs::directory_iterator()),
            2);  // one executable per topology
}

// --tp 2 on a 4-chip topology: one SPMD program over 2 chips (decision 0060) whose per-chip
// arguments hold half of the split weights; a degree the heads or the chips do not allow is one
// clear line.
TEST(XlaTpuAot, TinyFluxSplitOverTwoChipsIsOneSpmdProgram) {
  if (!have_libtpu()) GTEST_SKIP() << "no libtpu";
  TempDir tmp;
  const auto r = run_cli("compile --model " + tiny() + " --target tpu:v6e:2x2 --tp 2" +
                         " --height 64 --width 64 --cache-dir " + quote(tmp / "c") +
                         " --report " + quote(tmp / "r.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("split over 2 chips (memory per chip)"), std::string::npos) << r.out;
  const json rep = read_json(tmp / "r.json");
  EXPECT_EQ(rep["tp"].get<int>(), 2);
  const int64_t split = rep["split_parameter_bytes"].get<int64_t>();
  EXPECT_GT(split, rep["parameter_bytes"].get<int64_t>() / 2);  // q/k/v, MLPs, outputs
  ASSERT_EQ(rep["programs"].size(), 1u);
  const json& p = rep["programs"][0];
  EXPECT_EQ(p["partitions"].get<int>(), 2);
  EXPECT_TRUE(p["has_memory"].get<bool>());
  EXPECT_GT(fs::file_size(p["cache_file"].get<std::string>()), 1000u);

  const auto heads = run_cli("compile --model " + tiny() + " --target tpu:v6e:2x2 --tp 4" +
                             " --height 64 --width 64 --cache-dir " + quote(tmp / "c"));
  EXPECT_EQ(heads.code, 1);
  EXPECT_NE(heads.err.find("num_attention_heads=2 is not divisible by the tensor-parallel degree 4"),
            std::string::npos) << heads.err;
  const auto chips = run_cli("compile --model " + tiny() + " --target tpu:v6e:1x1 --tp 2" +
                             " --height 64 --width 64 --cache-dir " + quote(tmp / "c"));
  EXPECT_EQ(chips.code, 1);
  EXPECT_NE(chips.err.find("needs 2 devices"), std::string::npos) << chips.err;
  EXPECT_EQ(std::count(chips.err.begin(), chips.err.end(), '\n'), 1) << chips.err;
}

TEST(XlaTpuAot, UnknownTopologyIsOneLineError) {
  if (!have_libtpu()) GTEST_SKIP() << "no libtpu";
  TempDir tmp;
  const auto r = run_cli("compile --model " + tiny() + " --target tpu:v6e:7x9 --cache-dir " +
                         quote(tmp / "c"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("does not know the topology 'v6e:7x9'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace tessera
#endif
