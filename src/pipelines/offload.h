// Model CPU offload and sequential (block-streaming) offload: a model's weights are materialised
// (read from the memory map, converted to the run dtype if needed) only while it runs, then
// released. See docs/decisions/0011-offload.md.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "runtime/device.h"

namespace tessera {

enum class OffloadMode { none, model, sequential };
// "none", "model", "sequential"; anything else throws naming the accepted values.
OffloadMode offload_mode_from_name(const std::string& name);
const char* offload_mode_name(OffloadMode mode);

// The execution device for offload: `requested` if present (else an error naming it and what is
// available), otherwise the first accelerator present, otherwise the CPU.
Device resolve_offload_device(const std::optional<Device>& requested);

// The weights of one module (a whole model, or one repeated block) and where each came from.
class WeightSet {
 public:
  struct Entry {
    Tensor* slot;
    Tensor source;  // the checkpoint tensor (a zero-copy view of the map where possible)
    DType dtype;    // the run dtype
  };
  explicit WeightSet(bool materialised = true) : materialised_(materialised) {}
  void add(const Entry& e);
  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  int64_t bytes() const { return bytes_; }  // in the run dtype
  bool materialised() const { return materialised_; }
  // Where materialise() puts the weights (the execution device; default the CPU).
  void set_device(const Device& d) { device_ = d; }
  const Device& device() const { return device_; }
  // Fills every slot (zero-copy when the dtype matches, else converted now, even in deferred
  // mode; on another device, uploaded there) and counts the bytes as materialised and read.
  void materialise();
  // Clears every slot and drops the mapped pages of the sources from this process.
  void release();
  // Starts reading the sources' pages (madvise WILLNEED), for the block that runs next.
  void prefetch() const;

 private:
  std::vector<Entry> entries_;
  int64_t bytes_ = 0;
  bool materialised_ = true;  // load_weights filled the slots
  Device device_ = Device::cpu();
};

// Records every parameter that load_weights fills on this thread while it is alive.
class WeightRecorder final : public LoadObserver {
 public:
  WeightRecorder();
  ~WeightRecorder() override;
  void loaded(Tensor* slot, const Tensor& source, DType dtype) override;
  // `module`'s parameters that are defined now (after its loader's own fix-ups), counted as
  // materialised and read; with `release` (offload) the slots are cleared at once.
  WeightSet take(const Module& module, bool release);

 private:
  std::map<Tensor*, WeightSet::Entry> seen_;
  LoadObserver* prev_ = nullptr;
};

// One model's weights under offload: one set, or (sequential) one set per repeated block plus
// the rest. Block sets are materialised by a forward hook around each block. The block sets are
// shared by this record and the hooks, so either may be destroyed first: a DiffusionPipeline
// destroys its records after the derived pipeline's models (and their blocks) are gone, and
// the destructor never touches the model.
class OffloadedModel {
 public:
  OffloadedModel(Module& model, WeightSet weights) : model_(model), rest_(std::move(weights)) {}
  ~OffloadedModel();
  OffloadedModel(const OffloadedModel&) = delete;
  OffloadedModel& operator=(const OffloadedModel&) = delete;

  // Moves the parameters of `blocks` (in execution order) into per-block sets and installs the
  // hook that streams them: block i materialised before its forward, block i+1 prefetched, block
  // i released after.
  void stream_blocks(const std::vector<Module*>& blocks);
  // The device the weights are materialised on (pipe.enable_model_cpu_offload(device)).
  void set_device(const Device& d);
  void materialise();  // everything not streamed
  void release();      // everything
  int64_t bytes() const;

 private:
  friend class BlockStreamHook;
  Module& model_;
  WeightSet rest_;
  struct Blocks;  // the per-block sets and which block each is, shared with the hooks
  std::shared_ptr<Blocks> blocks_;
};

// Materialises a model for the lifetime of the scope under offload (no-op without offload).
class OffloadScope {
 public:
  OffloadScope(OffloadedModel* model, OffloadMode mode);
  ~OffloadScope() noexcept(false);  // synchronizes: a queued op's error surfaces here
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

 private:
  OffloadedModel* model_;
  OffloadMode mode_;
};

}  // namespace tessera
