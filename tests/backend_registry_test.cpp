// The backend seam (runtime/backend.h): the registry, the error for devices without a backend,
// and fusion as a property of the primitive.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "runtime/allocator.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/error.h"
#include "runtime/fusion.h"

namespace tessera {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BackendRegistry, CpuIsRegisteredAndAvailable) {
  const auto devs = available_devices();
  ASSERT_FALSE(devs.empty());
  EXPECT_EQ(devs[0], Device::cpu());
  Backend& b = backend_for(Device::cpu());
  EXPECT_STREQ(b.name(), "cpu");
  EXPECT_EQ(&b.allocator(Device::cpu()), &cpu_allocator());
  size_t listed = 0;  // a backend may be built with no device present (an XLA plugin missing)
  for (Backend* be : backends()) listed += be->devices().size();
  EXPECT_EQ(listed, devs.size());
  EXPECT_NO_THROW(require_available(Device::cpu()));
}

TEST(BackendRegistry, DeviceWithoutBackendIsAClearError) {
  const std::string want = "[device] cuda:0 is not available in this build/machine; available: cpu";
  EXPECT_NE(error_of([] { require_available(Device::parse("cuda:0")); }).find(want),
            std::string::npos);
  EXPECT_NE(error_of([] { backend_for(Device::parse("cuda:0")); }).find(want), std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({2}, DType::f32, Device::parse("cuda:0")); }).find(want),
            std::string::npos);
  EXPECT_NE(error_of([] { validate_compile_options({.backend = "cuda"}); })
                .find("[compile] backend 'cuda' is not built; this build compiles for backend \"cpu\""),
            std::string::npos);
}

TEST(BackendRegistry, HostCopiesAndDeviceCopy) {
  Backend& b = backend_for(Device::cpu());
  auto s = Storage::allocate(16, Device::cpu());
  const float src[4] = {1, 2, 3, 4};
  b.copy_from_host(src, *s, 0, sizeof src);
  float back[2] = {};
  b.copy_to_host(*s, 8, back, sizeof back);
  EXPECT_EQ(back[0], 3.f);
  EXPECT_EQ(back[1], 4.f);
  // A transposed view copied into a contiguous tensor.
  Tensor t = Tensor::empty({2, 2}, DType::f32, Device::cpu());
  std::memcpy(t.raw_data(), src, sizeof src);
  Tensor tt = t.transpose(0, 1);
  Tensor c = Tensor::empty({2, 2}, DType::f32, Device::cpu());
  b.copy(tt, c);
  const float* p = c.data<const float>();
  EXPECT_EQ(p[0], 1.f);
  EXPECT_EQ(p[1], 3.f);
  EXPECT_EQ(p[2], 2.f);
  EXPECT_EQ(p[3], 4.f);
}

TEST(BackendRegistry, FusionIsAPropertyOfThePrimitive) {
  Tensor a = Tensor::empty({4, 8}, DType::f32, Device::cpu());
  EXPECT_EQ(Binary(BinaryOp::add).fusion({a, a}), Fusion::elementwise);
  EXPECT_EQ(BinaryScalar(BinaryOp::pow, 2.0, false).fusion({a}), Fusion::none);
  EXPECT_EQ(Unary(UnaryOp::silu).fusion({a}), Fusion::elementwise);
  EXPECT_EQ(Copy().fusion({a}), Fusion::elementwise);
  EXPECT_EQ(Copy().fusion({a.transpose(0, 1)}), Fusion::none);
  EXPECT_EQ(RmsNorm(1e-6, RmsNormStyle::diffusers, false).fusion({a}), Fusion::rowwise);
  bool rowwise = true;
  EXPECT_TRUE(is_fusible(Binary(BinaryOp::mul), {a, a}, {{{4, 8}, DType::f32}}, &rowwise));
  EXPECT_FALSE(rowwise);
  Tensor i = Tensor::empty({4, 8}, DType::i64, Device::cpu());
  EXPECT_FALSE(is_fusible(Binary(BinaryOp::mul), {i, i}, {{{4, 8}, DType::i64}}, &rowwise));
  EXPECT_TRUE(fusion_supported(Device::cpu()));
  FusedInstr ins;
  ins.dtype = DType::f32;
  BinaryScalar(BinaryOp::add, 0.5, true).fused_instr(ins, {a});
  EXPECT_EQ(ins.kind, FusedInstr::binary_scalar);
  EXPECT_EQ(ins.scalar, 0.5f);
  EXPECT_TRUE(ins.scalar_first);
}

}  // namespace
}  // namespace tessera
