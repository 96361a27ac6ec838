#include "ops/attention.h"

#include <cmath>

#include "runtime/error.h"

namespace tessera {

void ScaledDotProductAttention::hash_attributes(Hasher& h) const {
  h.add(causal_);
  h.add_double(scale_);
  h.add(has_mask_);
}

bool ScaledDotProductAttention::equal_attributes(const Primitive& other) const {
  const auto& o = static_cast<const ScaledDotProductAttention&>(other);
  return causal_ == o.causal_ && scale_ == o.scale_ && has_mask_ == o.has_mask_;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options) {
  constexpr const char* op = "[scaled_dot_product_attention]";
  TESSERA_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, op,
                " q, k, v must be 4-D (B, H, L, D), got ", q.describe(), ", ", k.describe(), ", ",
                v.describe());
  TESSERA_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
                " q, k, v must share a dtype, got ", q.describe(), ", ", k.describe(), ", ",
                v.describe());
  TESSERA_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16, op,
                " supports f32 and bf16, got ", dtype_name(q.dtype()));
  const int64_t B = q.dim(0), H = q.dim(1), Lq = q.dim(2), D = q.dim(3);
  const int64_t Hkv = k.dim(1), Lk = k.dim(2), Dv = v.dim(3);
  TESSERA_CHECK(k.dim(0) == B && v.dim(0) == B, op, " batch sizes differ: q ", q.describe(), ", k ",
                k.describe(), ", v ", v.describe());
  TESSERA_CHECK(k.dim(3) == D, op, " k head dim ", k.dim(3), " != q head dim ", D);
  TESSERA_CHECK(v.dim(1) == Hkv && v.dim(2) == Lk, op, " v ", v.describe(), " must match k ",
                k.describe(), " in heads and length");
  TESSERA_CHECK(Hkv > 0 && H % Hkv == 0, op, " q heads ", H, " must be a multiple of k/v heads ",
                Hkv);
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(D));
  std::vector<Tensor> inputs = {q, k, v};
  if (options.mask.defined()) {
    Tensor m = options.mask;
    TESSERA_CHECK(m.ndim() <= 4, op, " mask must have at most 4 dims, got ", m.describe());
    TESSERA_CHECK(m.dtype() == DType::boolean || is_floating(m.dtype()), op,
                  " mask must be bool or floating, got ", dtype_name(m.dtype()));
    while (m.ndim() < 4) m = m.unsqueeze(0);
    const Shape full = {B, H, Lq, Lk};
    for (int i = 0; i < 4; ++i)
      TESSERA_CHECK(m.dim(i) == full[i] || m.dim(i) == 1, op, " mask ", options.mask.describe(),
                    " does not broadcast to ", shape_str(full));
    inputs.push_back(m.expand(full));
  }
  auto prim =
      std::make_shared<ScaledDotProductAttention>(options.causal, scale, options.mask.defined());
  return dispatch1(prim, inputs, {{B, H, Lq, Dv}, q.dtype()});
}

}  // namespace tessera
