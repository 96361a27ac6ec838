// CPU reductions over [outer, R, inner] views: each task owns a block of inner columns and walks
// the reduced dim, accumulating in double.
#include "ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/elementwise/elementwise_kernels.h"
#include "ops/copy.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

constexpr int64_t kBlock = 256;

// n contiguous elements of any dtype as doubles (integers exactly up to 2^53).
void load_f64(const char* p, DType t, int64_t n, double* out) {
  if (t == DType::i64 || t == DType::i32) {
    int64_t tmp[kBlock];
    convert_elements(p, t, tmp, DType::i64, size_t(n));
    for (int64_t i = 0; i < n; ++i) out[i] = double(tmp[i]);
    return;
  }
  float buf[kBlock];
  const float* f = ew_load(p, t, n, buf);
  for (int64_t i = 0; i < n; ++i) out[i] = f[i];
}

}  // namespace

void Reduce::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  const Shape& s = x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim_; ++i) outer *= s[i];
  for (int64_t i = dim_ + 1; i < x.ndim(); ++i) inner *= s[i];
  const int64_t r = s[dim_];
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
  const size_t es = dtype_size(x.dtype());
  const char* base = static_cast<const char*>(x.raw_data());
  const ReduceOp op = op_;
  const bool unbiased = unbiased_;
  parallel_for(
      outer * nblocks, std::max<int64_t>(1, 4096 / std::max<int64_t>(r, 1)),
      [&](int64_t w0, int64_t w1) {
        double acc[kBlock], acc2[kBlock], v[kBlock];
        int64_t idx[kBlock];
        for (int64_t w = w0; w < w1; ++w) {
          const int64_t ob = w / nblocks, i0 = (w % nblocks) * kBlock;
          const int64_t n = std::min(kBlock, inner - i0);
          auto row = [&](int64_t j) { return base + ((ob * r + j) * inner + i0) * int64_t(es); };
          const bool is_max = op == ReduceOp::max || op == ReduceOp::argmax;
          for (int64_t i = 0; i < n; ++i) {
            acc[i] = 0;
            acc2[i] = 0;
            idx[i] = 0;
          }
          if (is_max && r > 0) load_f64(row(0), x.dtype(), n, acc);
          for (int64_t j = is_max ? 1 : 0; j < r; ++j) {
            load_f64(row(j), x.dtype(), n, v);
            if (is_max) {
              for (int64_t i = 0; i < n; ++i) {
                // NaN wins and stays (first NaN for argmax), as torch.
                if (std::isnan(acc[i])) continue;
                if (std::isnan(v[i]) || v[i] > acc[i]) {
                  acc[i] = v[i];
                  idx[i] = j;
                }
              }
            } else {
              for (int64_t i = 0; i < n; ++i) acc[i] += v[i];
            }
          }
          if (op == ReduceOp::var) {
            for (int64_t i = 0; i < n; ++i) acc[i] /= double(r);
            for (int64_t j = 0; j < r; ++j) {
              load_f64(row(j), x.dtype(), n, v);
              for (int64_t i = 0; i < n; ++i) acc2[i] += (v[i] - acc[i]) * (v[i] - acc[i]);
            }
            const double denom = double(unbiased ? r - 1 : r);
            for (int64_t i = 0; i < n; ++i) acc[i] = denom > 0 ? acc2[i] / denom : NAN;
          } else if (op == ReduceOp::mean) {
            // torch's CPU mean is an fp32 sum divided by n.
            for (int64_t i = 0; i < n; ++i) acc[i] = double(float(acc[i]) / float(r));
          }
          const int64_t oo = ob * inner + i0;
          char* dst = static_cast<char*>(o.raw_data()) + oo * int64_t(dtype_size(o.dtype()));
          if (op == ReduceOp::argmax) {
            convert_elements(idx, DType::i64, dst, o.dtype(), size_t(n));
          } else if (o.dtype() == DType::i64 || o.dtype() == DType::i32) {
            int64_t tmp[kBlock];
            for (int64_t i = 0; i < n; ++i) tmp[i] = int64_t(acc[i]);
            convert_elements(tmp, DType::i64, dst, o.dtype(), size_t(n));
          } else {
            float f[kBlock];
            for (int64_t i = 0; i < n; ++i) f[i] = float(acc[i]);
            ew_store(f, dst, o.dtype(), n);
          }
        }
      });
}

}  // namespace tessera
