#include "ops/norm.h"

#include "ops/elementwise.h"
#include "runtime/error.h"

namespace tessera {

Fusion rowwise_fusion(const std::vector<Tensor>& in) {
  const Tensor& x = in[0];
  if (x.ndim() < 1 || x.shape().back() == 0 || !x.is_contiguous()) return Fusion::none;
  return Fusion::rowwise;
}

void LayerNorm::hash_attributes(Hasher& h) const {
  h.add_double(eps_);
  h.add(has_weight_);
  h.add(has_bias_);
}
bool LayerNorm::equal_attributes(const Primitive& o) const {
  const auto& p = static_cast<const LayerNorm&>(o);
  return p.eps_ == eps_ && p.has_weight_ == has_weight_ && p.has_bias_ == has_bias_;
}

void RmsNorm::hash_attributes(Hasher& h) const {
  h.add_double(eps_);
  h.add(uint64_t(style_));
  h.add(has_weight_);
}
bool RmsNorm::equal_attributes(const Primitive& o) const {
  const auto& p = static_cast<const RmsNorm&>(o);
  return p.eps_ == eps_ && p.style_ == style_ && p.has_weight_ == has_weight_;
}

void GroupNorm::hash_attributes(Hasher& h) const {
  h.add(uint64_t(groups_));
  h.add_double(eps_);
  h.add(has_weight_);
  h.add(has_bias_);
}
bool GroupNorm::equal_attributes(const Primitive& o) const {
  const auto& p = static_cast<const GroupNorm&>(o);
  return p.groups_ == groups_ && p.eps_ == eps_ && p.has_weight_ == has_weight_ &&
         p.has_bias_ == has_bias_;
}

namespace {

void check_param(const char* op, const char* what, const Tensor& p, int64_t size, const Tensor& x) {
  if (!p.defined()) return;
  TESSERA_CHECK(is_floating(p.dtype()), "[", op, "] ", what, " is ", p.describe(),
                ", expected a float tensor");
  TESSERA_CHECK(p.ndim() == 1 && p.shape()[0] == size, "[", op, "] ", what, " has shape ",
                shape_str(p.shape()), ", expected (", size, ") for input ", shape_str(x.shape()));
}

void check_input(const char* op, const Tensor& x, int64_t min_dims) {
  TESSERA_CHECK(x.defined(), "[", op, "] got an undefined input");
  TESSERA_CHECK(is_floating(x.dtype()), "[", op, "] input is ", x.describe(),
                ", expected a float tensor");
  TESSERA_CHECK(x.ndim() >= min_dims, "[", op, "] input has shape ", shape_str(x.shape()),
                ", expected at least ", min_dims, " dims");
}

bool is_half(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_input("layer_norm", x, 1);
  const int64_t d = x.shape().back();
  check_param("layer_norm", "weight", weight, d, x);
  check_param("layer_norm", "bias", bias, d, x);
  std::vector<Tensor> in{x};
  if (weight.defined()) in.push_back(weight);
  if (bias.defined()) in.push_back(bias);
  return dispatch1(std::make_shared<LayerNorm>(eps, weight.defined(), bias.defined()), in,
                   {x.shape(), x.dtype()});
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, RmsNormStyle style) {
  check_input("rms_norm", x, 1);
  check_param("rms_norm", "weight", weight, x.shape().back(), x);
  DType out = x.dtype();
  if (weight.defined()) {
    if (style == RmsNormStyle::diffusers)
      out = is_half(weight.dtype()) ? weight.dtype() : DType::f32;
    else
      out = weight.dtype() == x.dtype() ? x.dtype() : DType::f32;
  }
  std::vector<Tensor> in{x};
  if (weight.defined()) in.push_back(weight);
  return dispatch1(std::make_shared<RmsNorm>(eps, style, weight.defined()), in, {x.shape(), out});
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_input("group_norm", x, 2);
  const int64_t c = x.shape()[1];
  TESSERA_CHECK(groups > 0 && c % groups == 0, "[group_norm] ", c, " channels of input ",
                shape_str(x.shape()), " do not split into ", groups,
                " groups, expected channels divisible by groups");
  check_param("group_norm", "weight", weight, c, x);
  check_param("group_norm", "bias", bias, c, x);
  std::vector<Tensor> in{x};
  if (weight.defined()) in.push_back(weight);
  if (bias.defined()) in.push_back(bias);
  return dispatch1(std::make_shared<GroupNorm>(groups, eps, weight.defined(), bias.defined()), in,
                   {x.shape(), x.dtype()});
}

}  // namespace tessera
