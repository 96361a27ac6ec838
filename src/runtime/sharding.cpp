#include "runtime/sharding.h"

#include <cstring>

#include "runtime/backend.h"
#include "runtime/error.h"

namespace tessera {

std::vector<std::pair<int64_t, int64_t>> ShardSpec::ranges(int64_t full_size) const {
  std::vector<int64_t> blocks = packed.empty() ? std::vector<int64_t>{full_size} : packed;
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t base = 0;
  for (int64_t b : blocks) {
    const int64_t piece = b / parts;
    out.emplace_back(base + index * piece, base + (index + 1) * piece);
    base += b;
  }
  return out;
}

Shape ShardSpec::local_shape(const Shape& full) const {
  if (!sharded()) return full;
  Shape s = full;
  s[size_t(dim)] = 0;
  for (const auto& [b, e] : ranges(full[size_t(dim)])) s[size_t(dim)] += e - b;
  return s;
}

Tensor to_sharded(const Tensor& t, const Device& d, const ShardSpec& spec) {
  TESSERA_CHECK(t.defined(), "[to_sharded] tensor is undefined");
  TESSERA_CHECK(spec.sharded() && spec.dim < t.ndim(), "[to_sharded] a split along dim ",
                spec.dim, " in ", spec.parts, " of a tensor of shape ", shape_str(t.shape()));
  Backend& onto = backend_for(d);
  onto.prepare_sharding(d, int(spec.parts), "[to_sharded]");
  auto sh = std::make_shared<StorageSharding>();
  sh->spec = spec;
  sh->spec.index = 0;
  sh->shape = t.shape();
  sh->dtype = t.dtype();
  // The whole tensor's bytes on the host (a view of a memory map is read as is); the backend
  // sends each device only its piece.
  std::vector<char> host(t.nbytes());
  Backend& from = backend_for(t.device());
  Tensor src = t;
  if (!src.is_contiguous()) {
    Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
    from.copy(src, c);
    src = c;
  }
  from.copy_to_host(*src.storage(), size_t(src.offset()) * dtype_size(t.dtype()), host.data(),
                    host.size());
  Tensor out = Tensor::empty(t.shape(), t.dtype(), d);
  out.storage()->sharding = sh;
  if (t.numel() > 0) onto.copy_from_host(host.data(), *out.storage(), 0, host.size());
  return out;
}

Tensor empty_sharded(const Shape& shape, DType dtype, const Device& d, const ShardSpec& spec) {
  TESSERA_CHECK(spec.sharded() && spec.dim < int64_t(shape.size()), "[empty_sharded] a split "
                "along dim ", spec.dim, " in ", spec.parts, " of shape ", shape_str(shape));
  backend_for(d).prepare_sharding(d, int(spec.parts), "[empty_sharded]");
  auto sh = std::make_shared<StorageSharding>();
  sh->spec = spec;
  sh->spec.index = 0;
  sh->shape = shape;
  sh->dtype = dtype;
  Tensor out = Tensor::empty(shape, dtype, d);
  out.storage()->sharding = sh;
  return out;
}

}  // namespace tessera
