#include <gtest/gtest.h>

#include "nn/layers.h"
#include "runtime/error.h"

namespace tessera {
namespace {

struct Block : Module {
  nn::Linear proj{3, 2};
  nn::LayerNorm norm{2, 1e-6, /*elementwise_affine=*/false};
  Block() {
    register_module("proj", &proj);
    register_module("norm", &norm);
  }
};

TEST(Module, LoadsByDottedNamesAndConvertsDtype) {
  Block b;
  std::map<std::string, Tensor> w{
      {"proj.weight", Tensor::from_floats({1, 0, 0, 0, 1, 0}, {2, 3}, DType::bf16)},
      {"proj.bias", Tensor::from_floats({0.5f, -0.5f}, {2}, DType::bf16)},
      {"extra", Tensor::zeros({1}, DType::f32)}};
  auto unused = b.load_weights(MapWeightSource(w), {.dtype = DType::f32});
  EXPECT_EQ(unused, std::vector<std::string>{"extra"});
  EXPECT_EQ(b.proj.weight.dtype(), DType::f32);
  Tensor y = b.proj(Tensor::from_floats({1, 2, 3}, {1, 3}));
  EXPECT_EQ(y.to_floats(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(b.parameter_count(), 8);
}

TEST(Module, ShapeMismatchNamesTensorAndBothShapes) {
  Block b;
  std::map<std::string, Tensor> w{{"proj.weight", Tensor::zeros({3, 3}, DType::f32)},
                                  {"proj.bias", Tensor::zeros({2}, DType::f32)}};
  try {
    b.load_weights(MapWeightSource(w, "ckpt"), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "ckpt: tensor 'proj.weight' has shape (3, 3) but the config implies (2, 3)");
  }
  w.erase("proj.weight");
  EXPECT_THROW(b.load_weights(MapWeightSource(w), {}), Error);
}

}  // namespace
}  // namespace tessera
