// Shared test helpers: fixture paths and tolerance comparisons against PyTorch goldens.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace tessera::test {

// Where the pipeline goldens run: TESSERA_PIPELINE_DEVICE (tests/xla.cmake sets xla:cpu), else
// the CPU.
inline Device pipeline_device() {
  const char* d = std::getenv("TESSERA_PIPELINE_DEVICE");
  return Device::parse(d ? d : "cpu");
}

// Absolute path of a file under tests/fixtures/.
std::string fixture_path(const std::string& relative);
// True when the fixture exists; tests that need a fixture not yet generated call GTEST_SKIP
// with a message naming it only via this helper, so missing goldens are visible in the log.
bool has_fixture(const std::string& relative);
// All tensors of a fixture file.
std::map<std::string, Tensor> load_fixture(const std::string& relative);

// |a - e| <= atol + rtol * |e| elementwise; reports the worst element on failure.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol);
// Every bf16 element equals PyTorch's or is one bf16 ulp from it, or within `rtol` relative.
::testing::AssertionResult bf16_close(const Tensor& actual, const Tensor& expected,
                                      double rtol = 1e-2);
// Model activations against diffusers (docs/decisions/0008-model-tolerances.md):
// f32: max |a - e| <= 1e-4 (scaled by max(1, max|e|));
// bf16: mean |a - e| <= 1e-2 * mean|e| and max |a - e| <= 5e-2 * max(1, max|e|).
::testing::AssertionResult activations_close(const Tensor& actual, const Tensor& expected,
                                             DType compute_dtype);
// "max <max |a-e|> mean <mean |a-e|> (max|e| <max |e|>)", for logs and issue notes.
std::string diff_summary(const Tensor& actual, const Tensor& expected);

// The message of the tessera::Error that `f` throws, or "" when it throws none.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Token ids for a failure message: the first 40, then the count.
std::string show_ids(const std::vector<int64_t>& ids);

// Bit-for-bit equality (same dtype, same shape, same bytes).
::testing::AssertionResult bit_equal(const Tensor& actual, const Tensor& expected);

}  // namespace tessera::test
