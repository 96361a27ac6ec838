// Tensor: a shared handle to (storage, offset, shape, strides, dtype). Views share storage.
// Computation lives in ops/ (functions that dispatch primitives); this file only does views.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/storage.h"

namespace tessera {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;  // in elements

std::string shape_str(const Shape& s);  // "(1, 16, 64)"
int64_t shape_numel(const Shape& s);
Strides contiguous_strides(const Shape& s);

struct PendingOutput;  // runtime/graph.h: the recorded op output a pending tensor views

// with_view (tensor.cpp) copies these fields one by one: a new field must be added there too.
struct TensorImpl {
  std::shared_ptr<Storage> storage;        // null while pending (deferred/compiled modes)
  std::shared_ptr<PendingOutput> pending;  // set while storage is null in deferred mode
  int64_t offset = 0;                      // in elements
  Shape shape;
  Strides strides;
  DType dtype = DType::f32;
  Device device;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised contiguous tensor from the device allocator.
  static Tensor empty(const Shape& shape, DType dtype, const Device& device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device = Device::cpu());
  // Host values converted to `dtype` (rounded as torch rounds).
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::f32);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape,
                          DType dtype = DType::i64);
  // Zero-copy view of external memory (e.g. an mmapped safetensors region).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          std::shared_ptr<const void> keepalive,
                          const Device& device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int64_t dim(int64_t i) const;  // negative counts from the end
  int64_t ndim() const { return int64_t(impl_->shape.size()); }
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  const Device& device() const { return impl_->device; }
  const Strides& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  // Materialises a pending tensor (deferred mode) first.
  const std::shared_ptr<Storage>& storage() const;
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  std::string describe() const;  // "bf16(1, 16, 64)"

  // Pointer to element 0: a sync point (materialises a pending tensor, waits for the op that
  // writes it on an asynchronous stream).
  void* raw_data() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // Views (no copy). reshape/view require a layout that allows it; use contiguous() first.
  Tensor view(const Shape& shape) const;  // one dim may be -1
  Tensor reshape(const Shape& shape) const { return view(shape); }
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor expand(const Shape& shape) const;          // broadcast size-1 dims (stride 0)
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  // Alias with the same view but another dtype of equal size (bit reinterpretation).
  Tensor bitcast(DType dtype) const;

  // A contiguous copy on `d` through the two devices' backends (a sync point), or this tensor
  // when it is already on `d`.
  Tensor to(const Device& d) const;

  // Host reads (sync points): values converted to float / int64, in logical order.
  std::vector<float> to_floats() const;
  std::vector<int64_t> to_ints() const;
  float item() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

// Calls fn(offset_in_elements_of_a) for every element in row-major logical order.
template <typename F>
void for_each_offset(const Shape& shape, const Strides& strides, int64_t base, F&& fn) {
  const int64_t nd = int64_t(shape.size());
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(size_t(nd), 0);
  int64_t off = base;
  for (int64_t i = 0; i < n; ++i) {
    fn(off);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace tessera
