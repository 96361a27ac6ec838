#include "runtime/primitive.h"

#include <atomic>
#include <cstring>

#include "runtime/error.h"
#include "runtime/graph.h"
#include "runtime/graph_plan.h"
#include "runtime/modes.h"
#include "runtime/backend.h"

namespace tessera {
namespace {
std::atomic<int64_t> g_ops_dispatched{0};
}

void Hasher::add_double(double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  add(u);
}

void Hasher::add_string(const std::string& s) {
  for (unsigned char c : s) add(c);
  add(s.size());
}

std::vector<Tensor> dispatch(PrimitivePtr p, const std::vector<Tensor>& inputs,
                             const std::vector<TensorSpec>& outputs) {
  Device device = Device::cpu();
  bool have_device = false;
  for (const auto& t : inputs) {
    TESSERA_CHECK(t.defined(), "[", p->name(), "] got an undefined input tensor");
    if (!have_device) {
      device = t.device();
      have_device = true;
    } else {
      TESSERA_CHECK(t.device() == device, "[", p->name(), "] inputs are on different devices: ",
                    device.str(), " and ", t.device().str());
    }
  }
  ++g_ops_dispatched;
  Backend& backend = backend_for(device);
  // Kernels that dispatch ops themselves (contiguous() inside eval) run them inline.
  const bool nested = in_graph_execution() || backend.on_kernel_thread();
  if (!nested && (eager_mode() == EagerMode::DeferAndFuse || graph_detail::tracing()))
    return record_op(std::move(p), inputs, outputs, device);
  for (const auto& t : inputs)
    if (!t.impl()->storage && t.impl()->pending) t.storage();  // recorded earlier: materialise
  // Resolved in place, so the synchronous path needs no copy (the async lambda copies).
  const std::vector<Tensor>& ins = inputs;
  std::vector<Tensor> outs;
  outs.reserve(outputs.size());
  for (const auto& spec : outputs) outs.push_back(Tensor::empty(spec.shape, spec.dtype, device));
  if (nested)
    backend.run(*p, ins, outs);
  else
    backend.launch(std::move(p), ins, outs);
  return outs;
}

Tensor dispatch1(PrimitivePtr p, const std::vector<Tensor>& inputs, TensorSpec output) {
  std::vector<TensorSpec> outputs;  // the spec moved in: no copy of its shape per op
  outputs.push_back(std::move(output));
  return std::move(dispatch(std::move(p), inputs, outputs)[0]);
}

DispatchStats dispatch_stats() { return {g_ops_dispatched.load()}; }
void reset_dispatch_stats() { g_ops_dispatched = 0; }

void synchronize(const Device& device) {
  materialize_pending_graph();
  backend_for(device).synchronize(device);
}

void synchronize_all_devices() {
  materialize_pending_graph();
  wait_all_streams();
}

}  // namespace tessera
