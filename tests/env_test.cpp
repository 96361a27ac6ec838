// The environment switches (runtime/env.h): every TESSERA_* name in the tree is in the table,
// README documents every one the library reads, and malformed values fail with a clear error.
#include "runtime/env.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "io_test_folder.h"
#include "runtime/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::path(TESSERA_FIXTURES_DIR).parent_path().parent_path();

// TESSERA_* names that are not environment variables.
const std::set<std::string> kNotEnvironment = {
    "TESSERA_CHECK",        "TESSERA_FAIL",         // macros (runtime/error.h)
    "TESSERA_VERSION",      "TESSERA_SOURCE_DIR",   // compile definitions
    "TESSERA_FIXTURES_DIR", "TESSERA_CLI_PATH",     //
    "TESSERA_JUDGE_PATH",                           //
    "TESSERA_SANITIZE",     "TESSERA_BUILD_BENCH",  // CMake options
    "TESSERA_BUILD_TESTS",  "TESSERA_SOURCES",      //
    "TESSERA_HAS_XLA",      "TESSERA_XLA_SOURCES",  // the XLA backend's CMake switch
    "TESSERA_HAS_MPI",      "TESSERA_MPIRUN",       // the MPI process group's CMake switch
    "TESSERA_MPI_SOURCES",                          //
};

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// name -> one file that mentions it.
std::map<std::string, std::string> names_in_tree() {
  std::vector<fs::path> files = {kRoot / "README.md", kRoot / "tests/fuzz/run_fuzz.sh"};
  for (const char* dir : {"src", "apps", "scripts"})
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir))
      if (e.is_regular_file()) files.push_back(e.path());
  for (const auto& e : fs::directory_iterator(kRoot / "tests")) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".cmake" || ext == ".cpp" || ext == ".h"))
      files.push_back(e.path());
  }
  const std::regex name("TESSERA_[A-Z0-9_]+");
  std::map<std::string, std::string> found;
  for (const fs::path& p : files) {
    const std::string text = read_all(p);
    for (std::sregex_iterator it(text.begin(), text.end(), name), end; it != end; ++it)
      found.emplace(it->str(), fs::relative(p, kRoot).string());
  }
  return found;
}

TEST(Env, EveryNameInTheTreeIsInTheTable) {
  const auto found = names_in_tree();
  ASSERT_GT(found.size(), 10u) << "scanned " << kRoot;
  for (const auto& [n, file] : found)
    if (!kNotEnvironment.count(n))
      EXPECT_NE(env::find(n), nullptr) << n << " (in " << file << ") is not in runtime/env.cpp";
}

TEST(Env, TableIsIndexedByItsEnumAndDescribed) {
  std::set<std::string> names;
  for (size_t i = 0; i < env::table().size(); ++i) {
    const EnvSpec& s = env::table()[i];
    EXPECT_EQ(size_t(s.var), i) << s.name;
    EXPECT_EQ(&env::spec(s.var), &s);
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_NE(std::string(s.meaning), "") << s.name;
    EXPECT_NE(std::string(s.documented), "") << s.name;
  }
}

TEST(Env, ReadmeDocumentsEverySwitch) {
  const std::string readme = read_all(kRoot / "README.md");
  for (const EnvSpec& s : env::table())
    if (std::string(s.read_by) != "tests")
      EXPECT_NE(readme.find(std::string("`") + s.name), std::string::npos) << s.name;
}

// Sets a variable for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = env::raw(name)) saved_ = v;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (saved_)
      setenv(name_, saved_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Env, ParsesValuesAndDefaults) {
  {
    ScopedEnv e("TESSERA_DEFER_MAX_NODES", "");  // empty counts as unset
    EXPECT_FALSE(env::is_set(EnvVar::defer_max_nodes));
    EXPECT_EQ(env::integer(EnvVar::defer_max_nodes), 4096);
  }
  {
    ScopedEnv e("TESSERA_DEFER_MAX_NODES", "12");
    EXPECT_EQ(env::integer(EnvVar::defer_max_nodes), 12);
  }
  {
    ScopedEnv e("TESSERA_PACKED_WEIGHT_CACHE_MB", "");
    EXPECT_EQ(env::integer(EnvVar::packed_weight_cache_mb), std::nullopt);  // computed default
  }
  for (const char* on : {"1", "2", "true", "YES", "on"}) {
    ScopedEnv e("TESSERA_LAUNCH_BLOCKING", on);
    EXPECT_TRUE(env::flag(EnvVar::launch_blocking)) << on;
  }
  for (const char* off : {"0", "false", "No", "off"}) {
    ScopedEnv e("TESSERA_DEFER_REPEAT_CUT", off);
    EXPECT_FALSE(env::flag(EnvVar::defer_repeat_cut)) << off;
  }
  {
    ScopedEnv e("TESSERA_COMPILE", "regional");
    EXPECT_EQ(env::choice(EnvVar::compile), "regional");
  }
  {
    ScopedEnv e("TESSERA_CACHE_DIR", "/tmp/x y");
    EXPECT_EQ(env::string(EnvVar::cache_dir), "/tmp/x y");
  }
}

TEST(Env, MalformedValuesGiveAClearError) {
  {
    ScopedEnv e("TESSERA_NUM_THREADS", "abc");
    EXPECT_EQ(error_of([] { env::integer(EnvVar::num_threads); }),
              "[env] TESSERA_NUM_THREADS=abc: expected a positive integer");
    EXPECT_NE(error_of(env::validate), "(no error)");
  }
  for (const char* bad : {"0", "-3", "4x", " 4", "99999999999999999999"}) {
    ScopedEnv e("TESSERA_SDPA_QBLOCK", bad);
    EXPECT_EQ(error_of([] { env::integer(EnvVar::sdpa_qblock); }),
              std::string("[env] TESSERA_SDPA_QBLOCK=") + bad + ": expected a positive integer");
  }
  {
    ScopedEnv e("TESSERA_PACKED_WEIGHT_CACHE_MB", "-1");
    EXPECT_EQ(error_of([] { env::integer(EnvVar::packed_weight_cache_mb); }),
              "[env] TESSERA_PACKED_WEIGHT_CACHE_MB=-1: expected a non-negative integer");
  }
  {
    ScopedEnv e("TESSERA_ASYNC_DISPATCH", "maybe");
    EXPECT_EQ(error_of([] { env::flag(EnvVar::async_dispatch); }),
              "[env] TESSERA_ASYNC_DISPATCH=maybe: expected 1/0, true/false, yes/no or on/off");
  }
  {
    ScopedEnv e("TESSERA_CPU_ISA", "avx9");
    EXPECT_EQ(error_of([] { env::choice(EnvVar::cpu_isa); }),
              "[env] TESSERA_CPU_ISA=avx9: expected one of scalar, avx2, avx512, avx512_bf16, "
              "amx_bf16");
  }
  {
    ScopedEnv e("TESSERA_COMPILE", "fast");
    EXPECT_EQ(error_of([] { env::choice(EnvVar::compile); }),
              "[env] TESSERA_COMPILE=fast: expected one of full, regional");
  }
}

#ifdef TESSERA_CLI_PATH
// The CLI reports a malformed switch as its one error line, before any work.
TEST(Env, CliRejectsAMalformedSwitch) {
  ScopedEnv e("TESSERA_MIN_PARALLEL_WORK", "lots");
  const test::CliResult r = test::run_cli("inspect /nonexistent-model");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "tessera: error: [env] TESSERA_MIN_PARALLEL_WORK=lots: expected a positive integer\n");
}
#endif

}  // namespace
}  // namespace tessera
