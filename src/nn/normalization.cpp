#include "nn/normalization.h"

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/shape_ops.h"

namespace tessera::nn {

Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return x * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1);
}

TorchRMSNorm::TorchRMSNorm(int64_t dim, double e) : eps(e) {
  register_parameter("weight", &weight, {dim});
}

Tensor TorchRMSNorm::operator()(const Tensor& x) const {
  // rms_norm with an f32 weight keeps h in fp32 and returns f32; round once to x's dtype.
  return astype(rms_norm(x, astype(weight, DType::f32), eps), x.dtype());
}

AdaLayerNormZero::AdaLayerNormZero(int64_t dim)
    : linear(dim, 6 * dim), norm(dim, 1e-6, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

AdaLayerNormZero::Output AdaLayerNormZero::operator()(const Tensor& x, const Tensor& emb) const {
  auto c = chunk(linear(silu(emb)), 6, 1);  // shift, scale, gate (msa), shift, scale, gate (mlp)
  return {modulate(norm(x), c[0], c[1]), c[2], c[3], c[4], c[5]};
}

AdaLayerNormZeroSingle::AdaLayerNormZeroSingle(int64_t dim)
    : linear(dim, 3 * dim), norm(dim, 1e-6, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

AdaLayerNormZeroSingle::Output AdaLayerNormZeroSingle::operator()(const Tensor& x,
                                                                  const Tensor& emb) const {
  auto c = chunk(linear(silu(emb)), 3, 1);  // shift, scale, gate
  return {modulate(norm(x), c[0], c[1]), c[2]};
}

AdaLayerNormContinuous::AdaLayerNormContinuous(int64_t dim, int64_t cond_dim, double eps, bool bias)
    : linear(cond_dim, 2 * dim, bias), norm(dim, eps, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

Tensor AdaLayerNormContinuous::operator()(const Tensor& x, const Tensor& cond) const {
  auto c = chunk(linear(astype(silu(cond), x.dtype())), 2, 1);  // scale, shift (this order)
  return modulate(norm(x), c[1], c[0]);
}

SD35AdaLayerNormZeroX::SD35AdaLayerNormZeroX(int64_t dim)
    : linear(dim, 9 * dim), norm(dim, 1e-6, /*elementwise_affine=*/false) {
  register_module("linear", &linear);
  register_module("norm", &norm);
}

SD35AdaLayerNormZeroX::Output SD35AdaLayerNormZeroX::operator()(const Tensor& x,
                                                                const Tensor& emb) const {
  // shift, scale, gate (msa); shift, scale, gate (mlp); shift, scale, gate (msa2)
  auto c = chunk(linear(silu(emb)), 9, 1);
  const Tensor n = norm(x);
  return {modulate(n, c[0], c[1]), c[2], c[3], c[4], c[5], modulate(n, c[6], c[7]), c[8]};
}

}  // namespace tessera::nn
