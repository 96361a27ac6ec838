// Primitive: one op with its attributes. ops/ creates primitives and dispatches them; eval_cpu is
// the reference implementation (src/backends/cpu/), which the CPU backend runs; other backends
// run their own kernels (runtime/backend.h). The execution mode decides when an op runs (strict
// eager: now, on the device stream; deferred and compiled modes: later, possibly fused).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessera {

// Structural hash used to fingerprint graphs (op sequence + attributes + shapes + dtypes).
class Hasher {
 public:
  void add(uint64_t v) { h_ = (h_ ^ v) * 1099511628211ull; }
  void add_double(double v);
  void add_string(const std::string& s);
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

struct FusedInstr;  // runtime/fusion.h

// How an op joins a fused kernel in deferred and compiled modes (runtime/fusion.h).
// elementwise: one instruction of the kernel's program (Primitive::fused_instr); rowwise: output
// row r depends only on row r of input 0 (norms over the last dim), run per block of rows.
enum class Fusion : uint8_t { none, elementwise, rowwise };

struct TensorSpec {
  Shape shape;
  DType dtype;
};

// Compiled mode: what a kernel can set up once for fixed input and output views (library
// primitives, descriptors, packed weights, scratch). run() gets tensors of the views given to
// prepare_cpu (same shapes, strides, dtypes); only storages and offsets change between runs.
class PreparedKernel {
 public:
  virtual ~PreparedKernel() = default;
  virtual void run(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) = 0;
};

class Primitive {
 public:
  virtual ~Primitive() = default;
  virtual const char* name() const = 0;
  // Inputs are materialised tensors (any strides); outputs are freshly allocated contiguous
  // tensors of the specs the op function gave.
  virtual void eval_cpu(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) = 0;
  // Attributes for structural caching; two primitives with equal name and equal attributes
  // compute the same function of their inputs.
  virtual void hash_attributes(Hasher&) const {}
  virtual bool equal_attributes(const Primitive&) const { return true; }
  // Fusion of this op on these inputs (the runtime checks that all are floating and that there
  // is one output). fused_instr fills the op fields of an elementwise op's instruction (kind,
  // bop/uop, scalar); the runtime has set instr.dtype (the output's) and sets the operands.
  virtual Fusion fusion(const std::vector<Tensor>& /*inputs*/) const { return Fusion::none; }
  virtual void fused_instr(FusedInstr& /*instr*/, const std::vector<Tensor>& /*inputs*/) const {}
  // Optional (compiled mode): a kernel prepared for these views that computes exactly what
  // eval_cpu would; nullptr means eval_cpu runs each time.
  virtual std::unique_ptr<PreparedKernel> prepare_cpu(const std::vector<Tensor>& /*inputs*/,
                                                      const std::vector<Tensor>& /*outputs*/) {
    return nullptr;
  }
};

using PrimitivePtr = std::shared_ptr<Primitive>;

// Runs `p` on `inputs`, allocating one output per spec on the inputs' device. Every op in
// tessera goes through here, so this is where the execution modes hook in.
std::vector<Tensor> dispatch(PrimitivePtr p, const std::vector<Tensor>& inputs,
                             const std::vector<TensorSpec>& outputs);
Tensor dispatch1(PrimitivePtr p, const std::vector<Tensor>& inputs, TensorSpec output);

// Counters for the execution-mode statistics.
struct DispatchStats {
  int64_t ops_dispatched = 0;
};
DispatchStats dispatch_stats();
void reset_dispatch_stats();

// A sync point: runs what deferred mode recorded and waits for the queued work on `device`;
// throws the error of a queued op that failed.
void synchronize(const Device& device = Device::cpu());
// The same for every available device.
void synchronize_all_devices();

}  // namespace tessera
