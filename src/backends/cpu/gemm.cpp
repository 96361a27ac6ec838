// CPU matmul and linear on oneDNN's matmul primitive. bf16: fp32 accumulation, one rounding of
// the output (bias added before it), as PyTorch's CPU path. Where oneDNN has no bf16 kernel (a
// CPU without AVX-512, or TESSERA_CPU_ISA=avx2) an fp32 GEMM on converted inputs rounds the same.
#include <cstring>
#include <unordered_map>

#include "backends/cpu/onednn_util.h"
#include "ops/copy.h"
#include "ops/linalg.h"
#include "runtime/error.h"

namespace tessera {
namespace {

struct MatmulEntry {
  bool supported = false;
  bool pack_weights = false;  // weights are reordered into pd.weights_desc() (and cached)
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

onednn::PrimitiveCache<MatmulEntry>& matmul_cache() {
  static onednn::PrimitiveCache<MatmulEntry> c;
  return c;
}
[[maybe_unused]] const bool g_registered =
    (onednn::register_cache_clear([] { matmul_cache().clear(); }), true);

// K == 0: the product is empty, the result is the bias (or zeros).
void fill_bias(const Tensor& bias, Tensor& out) {
  std::memset(out.raw_data(), 0, out.nbytes());
  if (!bias.defined()) return;
  const int64_t n = out.dim(-1), rows = out.numel() / n;
  const size_t row_bytes = size_t(n) * dtype_size(out.dtype());
  const Tensor b = contiguous(bias);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.raw_data()) + r * row_bytes, b.raw_data(), row_bytes);
}

// out[.., M, N] = a[.., M, K] @ b[.., K, N] (+ bias[N]); a and b are views with equal ndim,
// batch dims broadcast where one side is 1; out is contiguous.
void run_gemm(const char* op, const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
              bool pack) {
  if (out.numel() == 0) return;
  if (a.dim(-1) == 0) return fill_bias(bias, out);
  const int64_t nd = out.ndim();
  const auto a_md = onednn::view_desc(a, op), b_md = onednn::view_desc(b, op),
             d_md = onednn::view_desc(out, op);
  dnnl::memory::desc bias_md;
  if (bias.defined()) {
    Shape bd(size_t(nd), 1);
    bd.back() = out.dim(-1);
    bias_md = onednn::view_desc(bd, contiguous_strides(bd), bias.dtype(), op);
  }
  onednn::KeyBuilder kb;
  kb.add(op).add(a).add(b).add(out).add(int64_t(bias.defined())).add(int64_t(pack));
  auto e = matmul_cache().get(kb.str(), [&] {
    MatmulEntry e;
    try {
      const dnnl::memory::desc w_md =
          pack ? dnnl::memory::desc(dnnl::memory::dims(b.shape().begin(), b.shape().end()),
                                    onednn::data_type(b.dtype(), op), dnnl::memory::format_tag::any)
               : b_md;
      const auto d = bias.defined() ? dnnl::matmul::desc(a_md, w_md, bias_md, d_md)
                                    : dnnl::matmul::desc(a_md, w_md, d_md);
      e.pd = dnnl::matmul::primitive_desc(d, onednn::engine());
      e.prim = dnnl::matmul(e.pd);
      e.pack_weights = pack && e.pd.weights_desc() != b_md;
      e.supported = true;
    } catch (const dnnl::error&) {
      e.supported = false;
    }
    return e;
  });
  if (!e->supported) {
    TESSERA_CHECK(out.dtype() == DType::bf16, "[", op, "] the kernel library has no kernel for ",
                  a.describe(), " x ", b.describe(), "; expected f32 or bf16 operands");
    Tensor out32 = Tensor::empty(out.shape(), DType::f32);
    run_gemm(op, astype(a, DType::f32), astype(b, DType::f32),
             bias.defined() ? astype(bias, DType::f32) : bias, out32, false);
    convert_elements(out32.raw_data(), DType::f32, out.raw_data(), DType::bf16,
                     size_t(out.numel()));
    return;
  }
  dnnl::memory w_mem = e->pack_weights ? onednn::packed_weights(b, b_md, e->pd.weights_desc())
                                       : onednn::wrap(b_md, b);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn::wrap(a_md, a)},
                                             {DNNL_ARG_WEIGHTS, w_mem},
                                             {DNNL_ARG_DST, onednn::wrap(d_md, out)}};
  if (bias.defined()) args[DNNL_ARG_BIAS] = onednn::wrap(bias_md, bias);
  onednn::sync_threads();
  e->prim.execute(onednn::stream(), args);
  onednn::stream().wait();
}

}  // namespace

void Matmul::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  run_gemm("matmul", in[0], in[1], Tensor(), out[0], false);
}

void Linear::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  // weight[N, K] seen as [K, N] (a transposed view, no copy) is oneDNN's weights operand.
  run_gemm("linear", in[0], in[1].transpose(0, 1), has_bias_ ? in[2] : Tensor(), out[0], true);
}

}  // namespace tessera
