// A component's diffusers/transformers goldens (goldens/<pipeline>/components/<component>/<dtype>/,
// written by reference/goldens) and the name-by-name comparison every model parity test makes.
#pragma once
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "runtime/dtype.h"
#include "test_util.h"

namespace tessera::test {

struct ComponentGolden {
  std::map<std::string, Tensor> inputs, outputs, intermediates;
};

// Loads the golden of `component` ("transformer", "text_encoder", "vae.decode", ...); false when
// it has not been generated.
inline bool load_component_golden(const std::string& pipeline, const std::string& component,
                                  DType dtype, ComponentGolden* g) {
  const std::string dir =
      "goldens/" + pipeline + "/components/" + component + "/" + dtype_name(dtype) + "/";
  if (!has_fixture(dir + "outputs.safetensors")) return false;
  g->inputs = load_fixture(dir + "inputs.safetensors");
  g->outputs = load_fixture(dir + "outputs.safetensors");
  g->intermediates = load_fixture(dir + "intermediates.safetensors");
  return true;
}

using CloseFn = std::function<::testing::AssertionResult(const std::string& name, const Tensor&,
                                                         const Tensor& expected)>;

// Every golden tensor has one of the same name, dtype and shape in `actual` that is `close`
// (decision 0008's activations_close in the compute dtype unless given); each diff is logged.
inline void expect_all_match(const std::map<std::string, Tensor>& golden,
                             const std::map<std::string, Tensor>& actual, DType dtype,
                             const char* what, const CloseFn& close = nullptr) {
  for (const auto& [name, expected] : golden) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << "no " << what << " named " << name;
    EXPECT_EQ(it->second.dtype(), expected.dtype()) << name;
    ASSERT_EQ(it->second.shape(), expected.shape()) << name;
    EXPECT_TRUE(close ? close(name, it->second, expected)
                      : activations_close(it->second, expected, dtype))
        << name;
    std::cout << "  " << name << ": " << diff_summary(it->second, expected) << "\n";
  }
}

}  // namespace tessera::test
