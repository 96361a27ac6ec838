#include "pipelines/offload.h"

#include <exception>

#include "io/safetensors.h"
#include "ops/copy.h"
#include "ops/linalg.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/memory_stats.h"
#include "runtime/modes.h"
#include "runtime/primitive.h"

namespace tessera {

OffloadMode offload_mode_from_name(const std::string& name) {
  if (name == "none") return OffloadMode::none;
  if (name == "model") return OffloadMode::model;
  if (name == "sequential") return OffloadMode::sequential;
  TESSERA_FAIL("[offload] unknown offload mode '", name, "'; expected none, model or sequential");
}

const char* offload_mode_name(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::model:
      return "model";
    case OffloadMode::sequential:
      return "sequential";
    default:
      return "none";
  }
}

Device resolve_offload_device(const std::optional<Device>& requested) {
  if (requested) {
    require_available(*requested);  // "[device] cuda:0 is not available ...; available: cpu"
    return *requested;
  }
  // The default is an accelerator with its own kernels (cuda); an XLA plugin that happens to be
  // installed (xla:cpu, tpu) is used only when named.
  for (Backend* b : backends()) {
    const DeviceType t = b->device_type();
    if (t == DeviceType::cpu || t == DeviceType::xla || t == DeviceType::tpu) continue;
    for (const Device& d : b->devices()) return d;
  }
  return Device::cpu();
}

void WeightSet::add(const Entry& e) {
  entries_.push_back(e);
  bytes_ += int64_t(shape_numel(e.source.shape()) * dtype_size(e.dtype));
}

void WeightSet::materialise() {
  if (materialised_) return;
  // Conversions run now, not recorded into a deferred segment that outlives the weights.
  const EagerMode mode = eager_mode();
  bool switched = false;
  int64_t read = 0;
  for (auto& e : entries_) {
    if (e.source.dtype() != e.dtype && !switched && mode != EagerMode::DeferNever) {
      set_eager_mode(EagerMode::DeferNever);
      switched = true;
    }
    Tensor w = astype(e.source, e.dtype);
    // Onto the execution device (an XLA device: uploaded now, freed when the slot is cleared).
    if (w.device() != device_) w = w.to(device_);
    *e.slot = std::move(w);
    read += int64_t(e.source.nbytes());
  }
  if (switched) set_eager_mode(mode);
  materialised_ = true;
  note_weights_materialised(bytes_);
  note_checkpoint_read(read);
}

void WeightSet::release() {
  if (!materialised_) return;
  for (auto& e : entries_) {
    *e.slot = Tensor();
    advise_mapped(e.source, MapAdvice::dont_need);
  }
  materialised_ = false;
  note_weights_released(bytes_);
}

void WeightSet::prefetch() const {
  for (const auto& e : entries_) advise_mapped(e.source, MapAdvice::will_need);
}

WeightRecorder::WeightRecorder() : prev_(set_load_observer(this)) {}
WeightRecorder::~WeightRecorder() {
  set_load_observer(prev_);
}

void WeightRecorder::loaded(Tensor* slot, const Tensor& source, DType dtype) {
  seen_[slot] = {slot, source, dtype};
}

WeightSet WeightRecorder::take(const Module& module, bool release) {
  WeightSet set(!release);
  int64_t converted = 0, converted_read = 0, mapped_read = 0;
  for (const auto& p : module.named_parameters()) {
    auto it = seen_.find(p.slot);
    if (it == seen_.end()) continue;
    if (p.slot->defined()) {  // a loader may drop a tied copy (T5's embed_tokens)
      const WeightSet::Entry& e = it->second;
      set.add(e);
      if (e.source.dtype() != e.dtype) {
        converted += int64_t(p.slot->nbytes());
        converted_read += int64_t(e.source.nbytes());
      } else {
        mapped_read += int64_t(e.source.nbytes());  // read as the model runs
      }
    }
    seen_.erase(it);
  }
  if (!release) {
    note_weights_materialised(set.bytes());
    note_checkpoint_read(converted_read + mapped_read);
    return set;
  }
  // Released as soon as loaded: only conversions held memory and read the file meanwhile;
  // zero-copy views of the map were never touched.
  note_weights_materialised(converted);
  note_checkpoint_read(converted_read);
  for (const auto& e : set.entries()) *e.slot = Tensor();
  note_weights_released(converted);
  return set;
}

struct OffloadedModel::Blocks {
  std::vector<WeightSet> sets;            // one per block, in execution order
  std::map<const Module*, size_t> index;  // block -> its set
};

// Streams one block's weights around its forward. Shares the block sets with the record instead
// of pointing at it: the record may be destroyed before the blocks (and the blocks before it).
class BlockStreamHook final : public ForwardHook {
 public:
  explicit BlockStreamHook(std::shared_ptr<OffloadedModel::Blocks> blocks)
      : blocks_(std::move(blocks)) {}
  void pre_forward(const Module& block) override {
    const size_t i = index(block);
    blocks_->sets[i].materialise();
    if (i + 1 < blocks_->sets.size()) blocks_->sets[i + 1].prefetch();
  }
  void post_forward(const Module& block) override {
    synchronize();  // deferred or queued ops that read the block run before it goes
    blocks_->sets[index(block)].release();
  }

 private:
  size_t index(const Module& block) const {
    auto it = blocks_->index.find(&block);
    TESSERA_CHECK(it != blocks_->index.end(), "[offload] a forward hook ran for a block ",
                  "that sequential offload does not stream");
    return it->second;
  }
  std::shared_ptr<OffloadedModel::Blocks> blocks_;
};

void OffloadedModel::stream_blocks(const std::vector<Module*>& blocks) {
  TESSERA_CHECK(!blocks_, "[offload] sequential offload is already enabled for this model");
  const bool was = rest_.materialised();
  auto streamed = std::make_shared<Blocks>();
  std::map<Tensor*, size_t> owner;
  for (size_t i = 0; i < blocks.size(); ++i) {
    streamed->index[blocks[i]] = i;
    for (const auto& p : blocks[i]->named_parameters()) owner[p.slot] = i;
  }
  rest_.release();
  const std::vector<WeightSet::Entry> all = rest_.entries();
  const Device device = rest_.device();
  rest_ = WeightSet(false);
  rest_.set_device(device);
  streamed->sets.assign(blocks.size(), WeightSet(false));
  for (auto& s : streamed->sets) s.set_device(device);
  for (const auto& e : all) {
    auto it = owner.find(e.slot);
    (it == owner.end() ? rest_ : streamed->sets[it->second]).add(e);
  }
  blocks_ = streamed;
  auto hook = std::make_shared<BlockStreamHook>(std::move(streamed));
  for (Module* b : blocks) b->set_forward_hook(hook);
  if (was) rest_.materialise();
}

// Only the accounting: the model (and its blocks, which keep their hooks) may be gone already.
OffloadedModel::~OffloadedModel() {
  if (rest_.materialised()) note_weights_released(rest_.bytes());
  if (blocks_)
    for (auto& b : blocks_->sets)
      if (b.materialised()) note_weights_released(b.bytes());
}

void OffloadedModel::set_device(const Device& d) {
  rest_.set_device(d);
  if (blocks_)
    for (auto& b : blocks_->sets) b.set_device(d);
}

void OffloadedModel::materialise() {
  rest_.materialise();
}

void OffloadedModel::release() {
  synchronize();
  rest_.release();
  if (blocks_)
    for (auto& b : blocks_->sets) b.release();
  clear_kernel_caches();  // repacked copies of the released weights would stay otherwise
}

int64_t OffloadedModel::bytes() const {
  int64_t n = rest_.bytes();
  if (blocks_)
    for (const auto& b : blocks_->sets) n += b.bytes();
  return n;
}

OffloadScope::OffloadScope(OffloadedModel* model, OffloadMode mode) : model_(model), mode_(mode) {
  if (model_ && mode_ != OffloadMode::none) model_->materialise();
}

OffloadScope::~OffloadScope() noexcept(false) {
  if (!model_ || mode_ == OffloadMode::none) return;
  if (std::uncaught_exceptions() == 0) {
    model_->release();
    return;
  }
  try {  // unwinding already: the first error is the one to report
    model_->release();
  } catch (...) {
  }
}

}  // namespace tessera
