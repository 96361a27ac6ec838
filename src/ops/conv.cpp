#include "ops/conv.h"

#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {

void Conv2d::hash_attributes(Hasher& h) const {
  for (int64_t v : p_.stride) h.add(uint64_t(v));
  for (int64_t v : p_.padding) h.add(uint64_t(v));
  for (int64_t v : p_.dilation) h.add(uint64_t(v));
  h.add(uint64_t(p_.groups));
  h.add(has_bias_);
}

bool Conv2d::equal_attributes(const Primitive& other) const {
  const auto& o = static_cast<const Conv2d&>(other);
  return o.p_.stride == p_.stride && o.p_.padding == p_.padding && o.p_.dilation == p_.dilation &&
         o.p_.groups == p_.groups && o.has_bias_ == has_bias_;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  TESSERA_CHECK(x.defined() && weight.defined(), "[conv2d] got an undefined input or weight");
  TESSERA_CHECK(x.ndim() == 4, "[conv2d] input must be 4-D (N, C, H, W), got ", x.describe());
  TESSERA_CHECK(weight.ndim() == 4, "[conv2d] weight must be 4-D (out, in/groups, kh, kw), got ",
                weight.describe());
  TESSERA_CHECK(x.dtype() == weight.dtype(), "[conv2d] mixed input dtypes: input is ", x.describe(),
                " and weight is ", weight.describe(), "; expected the same dtype");
  TESSERA_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "[conv2d] input is ",
                x.describe(), "; expected dtype f32 or bf16");
  TESSERA_CHECK(p.groups >= 1 && weight.dim(0) % p.groups == 0, "[conv2d] groups ", p.groups,
                " must be positive and divide the ", weight.dim(0), " output channels");
  TESSERA_CHECK(x.dim(1) == weight.dim(1) * p.groups, "[conv2d] input ", x.describe(), " has ",
                x.dim(1), " channels but weight ", weight.describe(), " expects ",
                weight.dim(1) * p.groups, " (weight.shape[1] ", weight.dim(1), " x groups ",
                p.groups, ")");
  for (int i = 0; i < 2; ++i) {
    TESSERA_CHECK(p.stride[i] >= 1 && p.dilation[i] >= 1, "[conv2d] stride and dilation must be ",
                  ">= 1, got stride (", p.stride[0], ", ", p.stride[1], ") dilation (",
                  p.dilation[0], ", ", p.dilation[1], ")");
  }
  for (int64_t v : p.padding)
    TESSERA_CHECK(v >= 0, "[conv2d] padding must be >= 0, got (", p.padding[0], ", ", p.padding[1],
                  ", ", p.padding[2], ", ", p.padding[3], ")");
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x.dim(2 + i) + p.padding[2 * i] + p.padding[2 * i + 1];
    const int64_t ext = p.dilation[i] * (weight.dim(2 + i) - 1) + 1;
    TESSERA_CHECK(in >= ext, "[conv2d] kernel ", shape_str({weight.dim(2), weight.dim(3)}),
                  " (dilated extent ", ext, ") is larger than the padded input ", x.describe(),
                  " along ", i == 0 ? "H" : "W");
    out_hw[i] = (in - ext) / p.stride[i] + 1;
  }
  std::vector<Tensor> inputs{contiguous(x), weight};
  if (bias.defined()) {
    TESSERA_CHECK(bias.dtype() == x.dtype(), "[conv2d] mixed input dtypes: input is ", x.describe(),
                  " and bias is ", bias.describe(), "; expected the same dtype");
    TESSERA_CHECK(bias.ndim() == 1 && bias.dim(0) == weight.dim(0), "[conv2d] bias ",
                  bias.describe(), " does not match weight ", weight.describe(),
                  "; expected shape ", shape_str({weight.dim(0)}));
    inputs.push_back(contiguous(bias));
  }
  return dispatch1(std::make_shared<Conv2d>(p, bias.defined()), inputs,
                   {{x.dim(0), weight.dim(0), out_hw[0], out_hw[1]}, x.dtype()});
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  Conv2dParams p;
  p.stride = stride;
  p.padding = {padding[0], padding[0], padding[1], padding[1]};
  return conv2d(x, weight, bias, p);
}

}  // namespace tessera
