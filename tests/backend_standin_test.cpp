// A second backend registered at run time, to check the claim of decision 0020: adding a backend
// needs its own folder plus one registration line, and the runtime asks it for everything.
// StandInBackend claims DeviceType::cuda, index 0, which this build does not have. It is a
// stand-in, not CUDA: its memory is a separate host heap (so it runs the CPU kernels, eval_cpu /
// prepare_cpu), and the conformance suite then runs every family on it in every mode, bitwise
// against the CPU (same kernels, so any difference is the runtime's doing).
//
// Registration is scoped to each test (register in SetUp, unregister_backend in TearDown), not
// global: other tests in the same process check that cuda:0 is "not available", and running
// ./tests/tessera_tests whole must still pass. Every stand-in storage must be freed before
// TearDown unregisters (a storage frees through backend_for), which TearDown checks.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "conformance_cases.h"
#include "ops/copy.h"
#include "runtime/backend.h"
#include "runtime/graph.h"

namespace tessera::conformance {
namespace {

// malloc with canaries around each block and poison in fresh and freed blocks: a kernel writing
// past its output trips a canary, and an output slot read before it is written reads 0xFF (NaN,
// -1) and differs from the CPU. Counters as MemoryStats; no caching (every block is fresh).
class StandInAllocator final : public Allocator {
 public:
  static constexpr size_t kGuard = 64;  // keeps the payload 64-byte aligned
  static constexpr unsigned char kCanary = 0xA5, kPoison = 0xFF;

  void* allocate(size_t bytes) override {
    auto* raw = static_cast<unsigned char*>(std::aligned_alloc(kGuard, kGuard * 2 + round(bytes)));
    TESSERA_CHECK(raw, "[standin] out of memory");
    std::memset(raw, kCanary, kGuard);
    std::memset(raw + kGuard, kPoison, bytes);
    std::memset(raw + kGuard + bytes, kCanary, kGuard + round(bytes) - bytes);
    current_ += int64_t(bytes);
    peak_ = std::max(peak_.load(), current_.load());
    ++allocs_;
    return raw + kGuard;
  }
  void deallocate(void* p, size_t bytes) override {
    auto* raw = static_cast<unsigned char*>(p) - kGuard;
    for (size_t i = 0; i < kGuard; ++i)
      if (raw[i] != kCanary || raw[kGuard + bytes + i] != kCanary) {
        ++canary_failures_;
        break;
      }
    std::memset(raw + kGuard, kPoison, bytes);
    std::free(raw);
    current_ -= int64_t(bytes);
  }
  MemoryStats stats() const override {
    return {.current_bytes = current_, .peak_bytes = peak_, .alloc_count = allocs_};
  }
  void reset_peak() override { peak_ = current_.load(); }
  void empty_cache() override {}
  int64_t canary_failures() const { return canary_failures_; }

 private:
  static size_t round(size_t b) { return (b + kGuard - 1) / kGuard * kGuard; }
  std::atomic<int64_t> current_{0}, peak_{0}, allocs_{0}, canary_failures_{0};
};

class StandInBackend final : public Backend {
 public:
  const char* name() const override { return "cuda"; }  // stand-in: the name CLI/compile use
  DeviceType device_type() const override { return DeviceType::cuda; }
  std::vector<Device> devices() const override { return {Device::parse("cuda:0")}; }

  Allocator& allocator(const Device&) override { return heap; }
  void copy_to_host(const Storage& src, size_t offset, void* dst, size_t bytes) override {
    std::memcpy(dst, static_cast<const char*>(src.data()) + offset, bytes);
    ++host_copies;
  }
  void copy_from_host(const void* src, Storage& dst, size_t offset, size_t bytes) override {
    std::memcpy(static_cast<char*>(dst.data()) + offset, src, bytes);
    ++host_copies;
  }

  // A synchronous stream: every op has finished when launch returns.
  void synchronize(const Device&) override {}
  void wait_for(const Storage&) override {}
  bool on_kernel_thread() const override { return false; }

  bool supports(const Primitive&, const std::vector<DType>&) const override { return true; }
  void launch(PrimitivePtr p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) override {
    check_here(ins, outs);
    p->eval_cpu(ins, outs);
    ++launches;
  }
  void run(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) override {
    check_here(ins, outs);
    p.eval_cpu(ins, outs);
    ++runs;
  }
  std::unique_ptr<PreparedKernel> prepare(Primitive& p, const std::vector<Tensor>& ins,
                                          const std::vector<Tensor>& outs) override {
    check_here(ins, outs);
    ++prepares;
    return p.prepare_cpu(ins, outs);
  }
  void copy(const Tensor& src, Tensor& dst) override {
    check_here({src}, {dst});
    Copy c;
    std::vector<Tensor> out{dst};
    c.eval_cpu({src}, out);
  }

  StandInAllocator heap;
  std::atomic<int64_t> launches{0}, runs{0}, prepares{0}, host_copies{0}, foreign{0};

 private:
  // The runtime must hand this backend only its own tensors.
  void check_here(const std::vector<Tensor>& ins, const std::vector<Tensor>& outs) {
    for (const auto* v : {&ins, &outs})
      for (const Tensor& t : *v)
        if (t.defined() && t.device().type != DeviceType::cuda) ++foreign;
  }
};

// Registers a fresh stand-in for the test; unregisters it after (it stays allocated).
class Standin : public ::testing::Test {
 protected:
  void SetUp() override {
    (void)backends();  // the builtin backends first, so the registry's order is cpu, cuda
    auto b = std::make_unique<StandInBackend>();
    be = b.get();
    register_backend(std::move(b));
  }
  void TearDown() override {
    set_eager_mode(EagerMode::DeferNever);
    set_async_dispatch(false);
    clear_segment_cache();
    const int64_t held = be->heap.stats().current_bytes;
    EXPECT_EQ(held, 0) << "stand-in blocks still held: the stand-in stays registered";
    if (held == 0) unregister_backend(DeviceType::cuda);  // and destroyed
  }
  StandInBackend* be = nullptr;
};

TEST_F(Standin, RegisteredAtRunTimeIsAnAvailableDevice) {
  const Device cuda = Device::parse("cuda:0");
  EXPECT_EQ(available_devices().size(), 2u);
  EXPECT_NO_THROW(require_available(cuda));
  EXPECT_EQ(&backend_for(cuda), be);
  EXPECT_NO_THROW(validate_compile_options({.backend = "cuda"}));
  const Tensor h = Tensor::from_floats({1, 2, 3, 4}, {2, 2}, DType::f32);
  const Tensor d = h.to(cuda);
  EXPECT_EQ(d.device(), cuda);
  EXPECT_EQ(be->heap.stats().current_bytes, 16);
  EXPECT_TRUE(test::bit_equal(d.to(Device::cpu()), h));
}

class StandinConformance : public Standin, public ::testing::WithParamInterface<size_t> {};

TEST_P(StandinConformance, EveryCaseInEveryModeBitwiseAgainstTheCpu) {
  const Family& f = kFamilies[GetParam()];
  const std::vector<Case> cases = f.gen(family_seed(GetParam()));
  ASSERT_FALSE(cases.empty());
  const std::vector<Device> devices = {Device::parse("cuda:0")};
  reset_mode_stats();
  {
    for (const Case& c : cases) {
      run_case(c, devices, /*bitwise=*/true);
      if (HasFailure() && std::getenv("TESSERA_CONFORMANCE_ALL") == nullptr) break;
    }
  }
  const ModeStats st = mode_stats();
  EXPECT_EQ(st.program_compiles, int64_t(cases.size()));
  EXPECT_EQ(st.program_cache_hits, int64_t(cases.size()));
  EXPECT_GT(st.segments, 0);
  reset_mode_stats();
  clear_segment_cache();
  // The runtime went through the stand-in: its heap, its kernels, only its tensors.
  EXPECT_GT(be->heap.stats().alloc_count, 0);
  EXPECT_GT(be->launches + be->runs + be->prepares, 0);
  EXPECT_GT(be->host_copies, 0);
  EXPECT_EQ(be->foreign, 0) << "the runtime passed a non-stand-in tensor to the stand-in";
  EXPECT_EQ(be->heap.canary_failures(), 0) << "a kernel wrote outside its block";
  EXPECT_EQ(be->heap.stats().current_bytes, 0) << "stand-in blocks still held after the family";
  std::printf(
      "[standin] %s: %zu cases on cuda:0 (stand-in), %lld launches, %lld runs, %lld prepared, "
      "%lld blocks, %lld fused kernels\n",
      f.name, cases.size(), (long long)be->launches, (long long)be->runs,
      (long long)be->prepares, (long long)be->heap.stats().alloc_count,
      (long long)st.fused_kernels);
}

INSTANTIATE_TEST_SUITE_P(Standin, StandinConformance,
                         ::testing::Range(size_t(0), std::size(kFamilies)),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::string(kFamilies[i.param].name);
                         });

// Runs after the fixtures above in a whole-binary run too: the registration did not leak.
TEST(StandinUnregistered, CudaIsNotAvailableOutsideTheStandinTests) {
  EXPECT_EQ(available_devices().size(), 1u);
  EXPECT_THROW(backend_for(Device::parse("cuda:0")), std::exception);
}

}  // namespace
}  // namespace tessera::conformance
