#include "ops/shape_ops.h"

#include "ops/elementwise.h"
#include "runtime/error.h"

namespace tessera {

void Pad::hash_attributes(Hasher& h) const {
  for (int64_t p : pads_) h.add(uint64_t(p));
  h.add(pads_.size());
  h.add_double(value_);
}

bool Pad::equal_attributes(const Primitive& o) const {
  const auto& p = static_cast<const Pad&>(o);
  return p.pads_ == pads_ && p.value_ == value_;
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  TESSERA_CHECK(!tensors.empty(), "[concat] got no tensors, expected at least one");
  const Tensor& first = tensors[0];
  TESSERA_CHECK(first.defined() && first.ndim() >= 1,
                "[concat] expected defined tensors with at least one dim");
  const int64_t d = normalize_dim(dim, first.ndim(), "concat");
  Shape out = first.shape();
  out[d] = 0;
  DType dt = first.dtype();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TESSERA_CHECK(t.defined(), "[concat] tensor ", i, " is undefined");
    bool ok = t.ndim() == first.ndim();
    for (int64_t k = 0; ok && k < t.ndim(); ++k) ok = k == d || t.shape()[k] == first.shape()[k];
    TESSERA_CHECK(ok, "[concat] tensor ", i, " has shape ", shape_str(t.shape()), ", expected ",
                  shape_str(first.shape()), " except along dim ", d);
    out[d] += t.shape()[d];
    dt = promote_dtypes(dt, t.dtype());
  }
  return dispatch1(std::make_shared<Concat>(d), tensors, {out, dt});
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const int64_t d = normalize_dim(dim, x.ndim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSERA_CHECK(s >= 0, "[split] negative size ", s);
    total += s;
  }
  TESSERA_CHECK(total == x.shape()[d], "[split] sizes sum to ", total, " but dim ", d, " of ",
                shape_str(x.shape()), " has ", x.shape()[d], ", expected equal");
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.slice(d, start, start + s));
    start += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
  const int64_t d = normalize_dim(dim, x.ndim(), "split");
  TESSERA_CHECK(size > 0, "[split] size ", size, ", expected > 0");
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < x.shape()[d]; s += size)
    sizes.push_back(std::min(size, x.shape()[d] - s));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TESSERA_CHECK(chunks > 0, "[chunk] chunks ", chunks, ", expected > 0");
  const int64_t d = normalize_dim(dim, x.ndim(), "chunk");
  const int64_t n = x.shape()[d];
  const int64_t size = (n + chunks - 1) / chunks;
  return split(x, size > 0 ? size : 1, d);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  TESSERA_CHECK(x.defined(), "[pad] got an undefined input");
  TESSERA_CHECK(pads.size() % 2 == 0 && int64_t(pads.size()) <= 2 * x.ndim(), "[pad] ", pads.size(),
                " pad values for input ", shape_str(x.shape()),
                ", expected an even count of at most 2 * ndim");
  Shape out = x.shape();
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const int64_t d = x.ndim() - 1 - int64_t(i);
    out[d] += pads[2 * i] + pads[2 * i + 1];
    TESSERA_CHECK(out[d] >= 0, "[pad] pads (", pads[2 * i], ", ", pads[2 * i + 1], ") on dim ", d,
                  " of ", shape_str(x.shape()), " give a negative size");
  }
  return dispatch1(std::make_shared<Pad>(pads, value), {x}, {out, x.dtype()});
}

}  // namespace tessera
