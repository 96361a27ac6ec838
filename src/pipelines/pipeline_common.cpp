#include "pipelines/pipeline_common.h"

#include <chrono>
#include <cmath>

#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"

namespace tessera {

Tensor repeat_rows(const Tensor& x, int n) {
  if (n == 1) return x;
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < x.dim(0); ++b)
    for (int i = 0; i < n; ++i) rows.push_back(x.slice(0, b, b + 1));
  return concat(rows, 0);
}

Tensor full(const Shape& shape, float value, DType dtype) {
  return Tensor::from_floats(std::vector<float>(size_t(shape_numel(shape)), value), shape, dtype);
}

Tensor postprocess_image(const Tensor& decoded) {
  Tensor x = add(mul(decoded, 0.5), 0.5);
  x = minimum(maximum(x, 0.0), 1.0);
  return astype(contiguous(x.permute({0, 2, 3, 1})), DType::f32);
}

std::vector<RgbImage> to_uint8_images(const Tensor& image) {
  const Tensor c = contiguous(astype(image, DType::f32));
  const float* p = c.data<float>();
  std::vector<RgbImage> out;
  const int64_t b = c.dim(0), h = c.dim(1), w = c.dim(2);
  for (int64_t i = 0; i < b; ++i) {
    RgbImage img{h, w, std::vector<uint8_t>(size_t(h * w * 3))};
    for (int64_t j = 0; j < h * w * 3; ++j) {
      const float v = std::nearbyint(p[i * h * w * 3 + j] * 255.f);  // float32 multiply as numpy
      img.pixels[size_t(j)] = uint8_t(std::min(255.f, std::max(0.f, v)));
    }
    out.push_back(std::move(img));
  }
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace tessera
