#include "ops/rope.h"

#include "runtime/error.h"

namespace tessera {

void RopeFrequencies::hash_attributes(Hasher& h) const {
  h.add(axes_dim_.size());
  for (int64_t d : axes_dim_) h.add(uint64_t(d));
  h.add_double(theta_);
}

bool RopeFrequencies::equal_attributes(const Primitive& other) const {
  const auto& o = static_cast<const RopeFrequencies&>(other);
  return axes_dim_ == o.axes_dim_ && theta_ == o.theta_;
}

void ApplyRope::hash_attributes(Hasher& h) const {
  h.add(uint64_t(layout_));
  h.add(uint64_t(math_));
  h.add(uint64_t(sequence_dim_));
}

bool ApplyRope::equal_attributes(const Primitive& other) const {
  const auto& o = static_cast<const ApplyRope&>(other);
  return layout_ == o.layout_ && math_ == o.math_ && sequence_dim_ == o.sequence_dim_;
}

std::pair<Tensor, Tensor> rope_frequencies(const Tensor& ids, const std::vector<int64_t>& axes_dim,
                                           double theta) {
  TESSERA_CHECK(ids.ndim() == 2 || ids.ndim() == 3, "[rope_frequencies] ids must be (L, n_axes) ",
                "or (B, L, n_axes), got ", ids.describe());
  TESSERA_CHECK(!axes_dim.empty() && ids.dim(-1) >= int64_t(axes_dim.size()),
                "[rope_frequencies] ids ", ids.describe(), " need at least ", axes_dim.size(),
                " columns, one per axis");
  int64_t total = 0;
  for (int64_t d : axes_dim) {
    TESSERA_CHECK(d > 0 && d % 2 == 0, "[rope_frequencies] every axis dim must be even and ",
                  "positive, got ", d);
    total += d;
  }
  Shape shape(ids.shape().begin(), ids.shape().end() - 1);
  shape.push_back(total);
  auto outs = dispatch(std::make_shared<RopeFrequencies>(axes_dim, theta), {ids},
                       {{shape, DType::f32}, {shape, DType::f32}});
  return {outs[0], outs[1]};
}

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeLayout layout,
                  int64_t sequence_dim, RopeMath math) {
  constexpr const char* op = "[apply_rope]";
  TESSERA_CHECK(x.ndim() >= 2 && is_floating(x.dtype()), op,
                " x must be floating with at least 2 dims, got ", x.describe());
  const int64_t sd = normalize_dim(sequence_dim, x.ndim(), "apply_rope");
  TESSERA_CHECK(sd != x.ndim() - 1, op, " sequence_dim must not be the head dim");
  const int64_t S = x.dim(sd), D = x.dim(-1);
  TESSERA_CHECK(D % 2 == 0, op, " head dim must be even, got ", D);
  TESSERA_CHECK(cos.shape() == sin.shape(), op, " cos ", cos.describe(), " and sin ",
                sin.describe(), " differ");
  const bool batched = cos.ndim() == 3;
  TESSERA_CHECK(
      (cos.ndim() == 2 || (batched && sd != 0 && (cos.dim(0) == x.dim(0) || cos.dim(0) == 1))) &&
          cos.dim(-2) == S && cos.dim(-1) == D,
      op, " cos/sin ", cos.describe(), " must be (", S, ", ", D, ") or (B, ", S, ", ", D,
      ") for x ", x.describe(), " with sequence_dim ", sd);
  return dispatch1(std::make_shared<ApplyRope>(layout, math, sd), {x, cos, sin},
                   {x.shape(), x.dtype()});
}

}  // namespace tessera
