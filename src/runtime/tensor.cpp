#include "runtime/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/graph.h"

namespace tessera {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ',';
  os << ')';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  TESSERA_CHECK(d >= 0 && d < ndim, "[", op, "] dimension ", dim, " out of range for a ", ndim,
                "-d tensor");
  return d;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const Device& device) {
  for (auto d : shape) TESSERA_CHECK(d >= 0, "[empty] negative dimension in ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(size_t(shape_numel(shape)) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Device& device) {
  Tensor t = empty(shape, dtype, device);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  TESSERA_CHECK(int64_t(values.size()) == shape_numel(shape), "[from_floats] ", values.size(),
                " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert_elements(values.data(), DType::f32, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  TESSERA_CHECK(int64_t(values.size()) == shape_numel(shape), "[from_ints] ", values.size(),
                " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert_elements(values.data(), DType::i64, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype,
                         std::shared_ptr<const void> keepalive, const Device& device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::borrow(data, size_t(shape_numel(shape)) * dtype_size(dtype), device,
                                  std::move(keepalive));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

int64_t Tensor::dim(int64_t i) const {
  return shape()[normalize_dim(i, ndim(), "dim")];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = ndim() - 1; i >= 0; --i) {
    if (shape()[i] != 1 && strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype())) + shape_str(shape());
}

const std::shared_ptr<Storage>& Tensor::storage() const {
  if (impl_ && !impl_->storage && impl_->pending) resolve_pending(*impl_);
  return impl_->storage;
}

void* Tensor::raw_data() const {
  TESSERA_CHECK(defined(), "[data] tensor is undefined");
  if (!impl_->storage && impl_->pending) resolve_pending(*impl_);
  TESSERA_CHECK(impl_->storage, "[data] tensor has no storage yet (pending)");
  const Storage& st = *impl_->storage;
  if (st.stream_seq.load(std::memory_order_acquire) != 0) backend_for(st.device()).wait_for(st);
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * int64_t(dtype_size(dtype()));
}

Tensor Tensor::to(const Device& d) const {
  TESSERA_CHECK(defined(), "[to] tensor is undefined");
  if (device() == d) return *this;
  Backend& from = backend_for(device());
  Backend& onto = backend_for(d);
  Tensor src = *this;
  if (!src.is_contiguous()) {  // backends copy whole blocks: gather the view on its device
    Tensor c = Tensor::empty(shape(), dtype(), device());
    from.copy(src, c);
    src = c;
  }
  Tensor out = Tensor::empty(shape(), dtype(), d);
  if (numel() == 0) return out;
  // Through host memory: neither backend knows the other's memory.
  std::vector<char> host(nbytes());
  from.copy_to_host(*src.storage(), size_t(src.offset()) * dtype_size(dtype()), host.data(),
                    host.size());
  onto.copy_from_host(host.data(), *out.storage(), 0, host.size());
  return out;
}

static Tensor with_view(const Tensor& t, Shape shape, Strides strides, int64_t offset) {
  // Field by field: copying the whole TensorImpl would copy the shape and strides it replaces.
  const TensorImpl& src = *t.impl();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = src.storage;
  impl->pending = src.pending;
  impl->dtype = src.dtype;
  impl->device = src.device;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  return Tensor(std::move(impl));
}

Tensor Tensor::view(const Shape& new_shape_in) const {
  Shape ns = new_shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < ns.size(); ++i) {
    if (ns[i] == -1) {
      TESSERA_CHECK(infer < 0, "[view] only one dimension can be -1 in ", shape_str(ns));
      infer = int64_t(i);
    } else {
      TESSERA_CHECK(ns[i] >= 0, "[view] negative dimension in ", shape_str(ns));
      known *= ns[i];
    }
  }
  if (infer >= 0) {
    TESSERA_CHECK(known > 0 && numel() % known == 0, "[view] cannot view ", describe(), " as ",
                  shape_str(new_shape_in));
    ns[infer] = numel() / known;
  }
  TESSERA_CHECK(shape_numel(ns) == numel(), "[view] cannot view a tensor of ", numel(),
                " elements ", shape_str(shape()), " as ", shape_str(new_shape_in));
  if (is_contiguous()) return with_view(*this, ns, contiguous_strides(ns), offset());
  // Non-contiguous: each run of old dims that is contiguous in memory ("chunk") must be split
  // exactly by consecutive new dims.
  Strides nst(ns.size());
  if (ndim() == 0) {
    for (auto& s : nst) s = 1;
    return with_view(*this, ns, nst, offset());
  }
  int64_t view_d = int64_t(ns.size()) - 1;
  int64_t chunk_base_stride = strides().back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    tensor_numel *= shape()[d];
    if (d == 0 || (shape()[d - 1] != 1 && strides()[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        nst[view_d] = view_numel * chunk_base_stride;
        view_numel *= ns[view_d];
        --view_d;
      }
      TESSERA_CHECK(view_numel == tensor_numel, "[view] cannot view non-contiguous ", describe(),
                    " as ", shape_str(ns), "; call contiguous() first");
      if (d > 0) {
        chunk_base_stride = strides()[d - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  TESSERA_CHECK(view_d == -1, "[view] cannot view ", describe(), " as ", shape_str(ns));
  return with_view(*this, ns, nst, offset());
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  TESSERA_CHECK(int64_t(dims.size()) == ndim(), "[permute] got ", dims.size(), " dims for ",
                describe());
  Shape s(dims.size());
  Strides st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], ndim(), "permute");
    TESSERA_CHECK(!seen[d], "[permute] dimension ", d, " repeated");
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return with_view(*this, s, st, offset());
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  std::vector<int64_t> p(static_cast<size_t>(ndim()));
  for (int64_t i = 0; i < ndim(); ++i) p[i] = i;
  std::swap(p[normalize_dim(a, ndim(), "transpose")], p[normalize_dim(b, ndim(), "transpose")]);
  return permute(p);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = normalize_dim(d, ndim(), "slice");
  const int64_t n = shape()[d];
  TESSERA_CHECK(step > 0, "[slice] step must be positive, got ", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape();
  Strides st = strides();
  s[d] = (end - start + step - 1) / step;
  st[d] *= step;
  return with_view(*this, s, st, offset() + start * strides()[d]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = normalize_dim(d, ndim(), "select");
  const int64_t n = shape()[d];
  if (index < 0) index += n;
  TESSERA_CHECK(index >= 0 && index < n, "[select] index ", index, " out of range for size ", n);
  Shape s = shape();
  Strides st = strides();
  const int64_t off = offset() + index * st[d];
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return with_view(*this, s, st, off);
}

Tensor Tensor::expand(const Shape& target) const {
  TESSERA_CHECK(int64_t(target.size()) >= ndim(), "[expand] cannot expand ", describe(), " to ",
                shape_str(target));
  const int64_t lead = int64_t(target.size()) - ndim();
  Shape s = target;
  Strides st(target.size(), 0);
  for (int64_t i = 0; i < ndim(); ++i) {
    const int64_t ti = i + lead;
    if (target[ti] == -1 || target[ti] == shape()[i]) {
      s[ti] = shape()[i];
      st[ti] = strides()[i];
    } else {
      TESSERA_CHECK(shape()[i] == 1, "[expand] cannot expand ", describe(), " to ",
                    shape_str(target), ": dimension ", i, " is ", shape()[i], ", not 1");
      st[ti] = 0;
    }
  }
  return with_view(*this, s, st, offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, ndim() + 1, "unsqueeze");
  Shape s = shape();
  Strides st = strides();
  const int64_t stride = d < ndim() ? st[d] * s[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return with_view(*this, s, st, offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, ndim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape s = shape();
  Strides st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return with_view(*this, s, st, offset());
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (ndim() == 0) return view({1});
  start = normalize_dim(start, ndim(), "flatten");
  end = normalize_dim(end, ndim(), "flatten");
  Shape s(shape().begin(), shape().begin() + start);
  int64_t m = 1;
  for (int64_t i = start; i <= end; ++i) m *= shape()[i];
  s.push_back(m);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return view(s);
}

Tensor Tensor::bitcast(DType t) const {
  TESSERA_CHECK(dtype_size(t) == dtype_size(dtype()), "[bitcast] ", dtype_name(dtype()), " and ",
                dtype_name(t), " differ in size");
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->dtype = t;
  return Tensor(std::move(impl));
}

std::vector<float> Tensor::to_floats() const {
  // Another device's memory is not host memory: read a host copy.
  if (defined() && device().type != DeviceType::cpu)
    return to(Device::cpu()).to_floats();
  std::vector<float> out(static_cast<size_t>(numel()));
  const size_t es = dtype_size(dtype());
  if (numel() == 0) return out;
  // raw_data() is the sync point; base is element 0 of the storage.
  const char* base = static_cast<const char*>(raw_data()) - offset() * int64_t(es);
  size_t i = 0;
  for_each_offset(shape(), strides(), offset(), [&](int64_t off) {
    convert_elements(base + off * int64_t(es), dtype(), &out[i++], DType::f32, 1);
  });
  return out;
}

std::vector<int64_t> Tensor::to_ints() const {
  // Another device's memory is not host memory: read a host copy.
  if (defined() && device().type != DeviceType::cpu)
    return to(Device::cpu()).to_ints();
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  const size_t es = dtype_size(dtype());
  if (numel() == 0) return out;
  // raw_data() is the sync point; base is element 0 of the storage.
  const char* base = static_cast<const char*>(raw_data()) - offset() * int64_t(es);
  size_t i = 0;
  for_each_offset(shape(), strides(), offset(), [&](int64_t off) {
    if (is_floating(dtype())) {
      float f;
      convert_elements(base + off * int64_t(es), dtype(), &f, DType::f32, 1);
      out[i++] = int64_t(f);
    } else {
      convert_elements(base + off * int64_t(es), dtype(), &out[i++], DType::i64, 1);
    }
  });
  return out;
}

float Tensor::item() const {
  TESSERA_CHECK(numel() == 1, "[item] tensor ", describe(), " has ", numel(), " elements, not 1");
  return to_floats()[0];
}

}  // namespace tessera
