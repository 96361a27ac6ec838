// Backend conformance (issue 18 part 6): every op of src/ops/*.h on seeded random shapes (odd
// sizes, broadcasts, strided views), dtypes and edge values, on every available device, in
// every execution mode, against the CPU's strict eager. The harness is conformance_cases.h.
// TESSERA_CONFORMANCE_SEED=N draws other cases (the failing case's name carries its shapes).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "conformance_cases.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linalg.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "ops/rope.h"
#include "ops/shape_ops.h"
#include "ops/softmax.h"
#include "runtime/graph.h"

namespace tessera::conformance {
namespace {

// ---------------------------------------------------------------------------------------------
// The families (kFamilies, conformance_cases.h) and the tests.

class BackendConformance : public ::testing::TestWithParam<size_t> {
 protected:
  void TearDown() override {
    set_eager_mode(EagerMode::DeferNever);
    set_async_dispatch(false);
    clear_segment_cache();
  }
};

TEST_P(BackendConformance, EveryCaseOnEveryDeviceInEveryMode) {
  const Family& f = kFamilies[GetParam()];
  const std::vector<Device> devices = available_devices();
  const std::vector<Case> cases = f.gen(family_seed(GetParam()));
  ASSERT_FALSE(cases.empty());
  reset_mode_stats();
  for (const Case& c : cases) {
    run_case(c, devices);
    if (HasFailure() && std::getenv("TESSERA_CONFORMANCE_ALL") == nullptr) break;
  }
  // The modes ran what they claim: one program per case replayed once, deferred segments.
  const ModeStats st = mode_stats();
  EXPECT_EQ(st.program_compiles, int64_t(cases.size() * devices.size()));
  EXPECT_EQ(st.program_cache_hits, int64_t(cases.size() * devices.size()));
  EXPECT_GT(st.segments, 0);
  reset_mode_stats();
  std::string devs;
  for (const Device& d : devices) devs += " " + d.str();
  RecordProperty("cases", int(cases.size()));
  std::printf(
      "[conformance] %s: %zu cases on%s, seed %llu; %lld segments (%lld replayed), "
      "%lld fused kernels\n",
      f.name, cases.size(), devs.c_str(), (unsigned long long)family_seed(GetParam()),
      (long long)st.segments, (long long)st.replayed_segments, (long long)st.fused_kernels);
}

// Named "conformance/..." so that `ctest -R conformance` selects the whole suite.
INSTANTIATE_TEST_SUITE_P(conformance, BackendConformance,
                         ::testing::Range(size_t(0), std::size(kFamilies)),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::string(kFamilies[i.param].name);
                         });

// ---------------------------------------------------------------------------------------------
// Coverage: every op function, primitive name and op enum value declared in src/ops/*.h (and
// runtime/elementwise_op.h) is exercised by some case. A new op (or enum value) without a case
// fails here.

std::string strip_comments(const std::string& s) {
  return std::regex_replace(s, std::regex("//[^\n]*"), "");
}

std::set<std::string> declared_ops() {
  const std::filesystem::path dir =
      std::filesystem::path(TESSERA_FIXTURES_DIR).parent_path().parent_path() / "src" / "ops";
  std::set<std::string> names;
  const std::regex fn(
      R"re((?:^|\n)\s*(?:inline\s+)?(?:Tensor|std::vector<Tensor>|std::pair<Tensor,\s*Tensor>)\s+([a-z_0-9]+)\s*\()re");
  const std::regex prim(R"re(name\(\)\s+const\s+override\s*\{\s*return\s+"([a-z_0-9]+)")re");
  const std::regex en(R"(enum\s+class\s+(\w+)(?:\s*:\s*\w+)?\s*\{([^}]*)\})");
  // The op enums live in runtime/elementwise_op.h (they are the fused kernel's instruction set).
  std::vector<std::filesystem::path> headers = {dir.parent_path() / "runtime" / "elementwise_op.h"};
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".h") headers.push_back(entry.path());
  for (const auto& path : headers) {
    std::ifstream is(path);
    const std::string text = strip_comments(std::string(std::istreambuf_iterator<char>(is), {}));
    for (std::sregex_iterator it(text.begin(), text.end(), fn), end; it != end; ++it)
      names.insert("fn:" + (*it)[1].str());
    for (std::sregex_iterator it(text.begin(), text.end(), prim), end; it != end; ++it)
      names.insert("prim:" + (*it)[1].str());
    for (std::sregex_iterator it(text.begin(), text.end(), en), end; it != end; ++it) {
      std::stringstream body((*it)[2].str());
      for (std::string v; std::getline(body, v, ',');) {
        v = std::regex_replace(v, std::regex(R"(\s|=.*)"), "");
        if (!v.empty()) names.insert("enum:" + (*it)[1].str() + "::" + v);
      }
    }
  }
  // Primitives whose name() depends on an enum attribute: every value the parse counted.
  auto count = [&](const std::string& type) {
    return std::count_if(names.begin(), names.end(), [&](const std::string& n) {
      return n.rfind("enum:" + type + "::", 0) == 0;
    });
  };
  for (int64_t v = 0; v < count("BinaryOp"); ++v)
    names.insert(std::string("prim:") + Binary(BinaryOp(v)).name());
  for (int64_t v = 0; v < count("UnaryOp"); ++v)
    names.insert(std::string("prim:") + Unary(UnaryOp(v)).name());
  for (int64_t v = 0; v < count("ReduceOp"); ++v)
    names.insert(std::string("prim:") + Reduce(ReduceOp(v), 0, false).name());
  return names;
}

// Parameterised only to share the "conformance/" prefix.
class BackendConformanceCoverage : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(conformance, BackendConformanceCoverage, ::testing::Values(0));

TEST_P(BackendConformanceCoverage, EveryOpFunctionPrimitiveAndEnumValueHasACase) {
  const std::set<std::string> declared = declared_ops();
  // The parse found the ops (a broken regex must not make this test vacuous).
  for (const char* must : {"fn:matmul", "fn:scaled_dot_product_attention", "fn:rope_frequencies",
                           "prim:group_norm", "enum:UnaryOp::quick_gelu", "enum:RopeMath::fp32"})
    ASSERT_TRUE(declared.count(must)) << must << " not found in src/ops/*.h";
  std::set<std::string> covered;
  size_t n = 0;
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    for (const Case& c : kFamilies[i].gen(family_seed(i))) {
      covered.insert(c.covers.begin(), c.covers.end());
      ++n;
    }
  std::string missing;
  for (const std::string& d : declared)
    if (!covered.count(d)) missing += " " + d;
  EXPECT_TRUE(missing.empty()) << "declared in src/ops/*.h but exercised by no conformance case:"
                               << missing;
  std::string stale;
  for (const std::string& c : covered)
    if (!declared.count(c)) stale += " " + c;
  EXPECT_TRUE(stale.empty()) << "cases claim ops that src/ops/*.h does not declare:" << stale;
  std::printf("[conformance] %zu cases cover %zu declared ops, primitives and enum values\n", n,
              declared.size());
}

// A case that claims a primitive must dispatch at least one op (its claim is not just a label).
TEST_P(BackendConformanceCoverage, CasesThatClaimAPrimitiveDispatchOps) {
  set_eager_mode(EagerMode::DeferNever);
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    for (const Case& c : kFamilies[i].gen(family_seed(i))) {
      const bool claims = std::any_of(c.covers.begin(), c.covers.end(), [](const std::string& s) {
        return s.rfind("prim:", 0) == 0;
      });
      if (!claims) continue;
      reset_dispatch_stats();
      c.fn(c.inputs);
      EXPECT_GT(dispatch_stats().ops_dispatched, 0) << c.name;
    }
}

}  // namespace
}  // namespace tessera::conformance
