#include "backends/cpu/cpu_backend.h"

#include <cstring>

#include "backends/cpu/cpu_allocator.h"
#include "backends/cpu/cpu_stream.h"
#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {

namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  std::vector<Device> devices() const override { return {Device::cpu()}; }

  Allocator& allocator(const Device&) override { return cpu_allocator(); }
  void copy_to_host(const Storage& src, size_t offset, void* dst, size_t bytes) override {
    wait_for_storage(src);
    std::memcpy(dst, static_cast<const char*>(src.data()) + offset, bytes);
  }
  void copy_from_host(const void* src, Storage& dst, size_t offset, size_t bytes) override {
    wait_for_storage(dst);
    std::memcpy(static_cast<char*>(dst.data()) + offset, src, bytes);
  }

  void synchronize(const Device&) override { cpu_stream().synchronize(); }
  void wait_for(const Storage& s) override { wait_for_storage(s); }
  bool on_kernel_thread() const override { return Stream::on_worker(); }

  // Every primitive has eval_cpu: the CPU runs everything it is given.
  bool supports(const Primitive&, const std::vector<DType>&) const override { return true; }
  void launch(PrimitivePtr p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) override {
    Stream& s = cpu_stream();
    if (s.async()) {
      Primitive* raw = p.get();
      const uint64_t seq = s.submit(
          raw->name(), [p = std::move(p), ins, outs]() mutable { p->eval_cpu(ins, outs); });
      for (const auto& t : ins) t.impl()->storage->stream_seq.store(seq, std::memory_order_release);
      for (const auto& t : outs)
        t.impl()->storage->stream_seq.store(seq, std::memory_order_release);
      return;
    }
    p->eval_cpu(ins, outs);
  }
  void run(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) override {
    p.eval_cpu(ins, outs);
  }
  std::unique_ptr<PreparedKernel> prepare(Primitive& p, const std::vector<Tensor>& ins,
                                          const std::vector<Tensor>& outs) override {
    return p.prepare_cpu(ins, outs);
  }
  void copy(const Tensor& src, Tensor& dst) override {
    wait_for_storage(*src.storage());  // src may still be written on the asynchronous stream
    wait_for_storage(*dst.storage());
    Copy c;
    std::vector<Tensor> out{dst};
    c.eval_cpu({src}, out);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace tessera
