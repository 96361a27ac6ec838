// CPU matmul and linear. bf16 on CPUs with AMX runs our own tile kernel (gemm_amx.h); everything
// else runs oneDNN's matmul primitive (docs/decisions/0002-gemm-library.md). bf16 either way:
// fp32 accumulation, bias added in fp32, one rounding of the output, as PyTorch's CPU path.
// Where oneDNN has no bf16 kernel (a CPU without AVX-512, or TESSERA_CPU_ISA=avx2) an fp32 GEMM
// on converted inputs rounds the same.
#include <cstring>
#include <map>
#include <unordered_map>

#include "backends/cpu/gemm/gemm_amx.h"
#include "backends/cpu/onednn_util.h"
#include "ops/copy.h"
#include "ops/linalg.h"
#include "runtime/cpu_features.h"
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
  const int threads = onednn::gemm_threads(out.numel() * a.dim(-1));
  onednn::sync_threads(threads);
  onednn::KeyBuilder kb;
  kb.add(op).add(a).add(b).add(out).add(int64_t(bias.defined())).add(int64_t(pack));
  kb.add(int64_t(threads));
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
  onednn::sync_threads(threads);
  e->prim.execute(onednn::stream(), args);
  onednn::stream().wait();
}

// bf16 with AMX tiles (TESSERA_CPU_ISA=avx512_bf16 or lower keeps oneDNN, to compare the two).
// K <= 64 (e.g. FLUX's x_embedder) stays on oneDNN: there the output write dominates and
// oneDNN's was measured faster.
bool use_amx(const Tensor& out, int64_t K) {
  static const bool amx = cpu_isa() >= CpuIsa::amx_bf16;
  return amx && out.dtype() == DType::bf16 && amx_gemm::enabled() && K > 64 && out.numel() > 0;
}

std::vector<float> bias_f32(const Tensor& bias) {
  if (!bias.defined()) return {};
  std::vector<float> b(size_t(bias.numel()));
  convert_elements(contiguous(bias).raw_data(), bias.dtype(), b.data(), DType::f32, b.size());
  return b;
}

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias) on AMX, the weight packed once (cached).
void linear_amx(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  const std::vector<float> b = bias_f32(bias);
  const auto packed = amx_gemm::packed_weight(w);
  amx_gemm::Problem p;
  p.a = static_cast<const uint16_t*>(x.raw_data());
  p.sam = x.strides()[0];
  p.sak = x.strides()[1];
  p.b_packed = packed.get();
  p.bias = b.empty() ? nullptr : b.data();
  p.c = static_cast<uint16_t*>(out.raw_data());
  p.ldc = out.dim(1);
  p.M = x.dim(0);
  p.K = x.dim(1);
  p.N = w.dim(0);
  amx_gemm::gemm({p});
}

// out[.., M, N] = a[.., M, K] @ b[.., K, N] on AMX: each distinct b matrix packed once per call,
// all batch entries in one parallel run.
void matmul_amx(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t nd = out.ndim(), M = out.dim(-2), N = out.dim(-1), K = a.dim(-1);
  const int64_t batch = out.numel() / (M * N);
  std::map<int64_t, Tensor> packed;  // b's element offset -> its packed tiles
  std::vector<amx_gemm::Problem> problems;
  problems.reserve(size_t(batch));
  const auto* a0 = static_cast<const uint16_t*>(a.raw_data());
  const auto* b0 = static_cast<const uint16_t*>(b.raw_data());
  auto* c0 = static_cast<uint16_t*>(out.raw_data());
  for (int64_t i = 0; i < batch; ++i) {
    int64_t rest = i, ao = 0, bo = 0;
    for (int64_t d = nd - 3; d >= 0; --d) {
      const int64_t n = out.shape()[size_t(d)], idx = rest % n;
      rest /= n;
      if (a.shape()[size_t(d)] > 1) ao += idx * a.strides()[size_t(d)];
      if (b.shape()[size_t(d)] > 1) bo += idx * b.strides()[size_t(d)];
    }
    auto it = packed.find(bo);
    if (it == packed.end()) {
      Tensor t = Tensor::empty({int64_t(amx_gemm::packed_b_elems(K, N))}, DType::bf16);
      amx_gemm::pack_b(b0 + bo, b.strides()[size_t(nd - 2)], b.strides()[size_t(nd - 1)], K, N,
                       static_cast<uint16_t*>(t.raw_data()));
      it = packed.emplace(bo, t).first;
    }
    amx_gemm::Problem p;
    p.a = a0 + ao;
    p.sam = a.strides()[size_t(nd - 2)];
    p.sak = a.strides()[size_t(nd - 1)];
    p.b_packed = static_cast<const uint16_t*>(it->second.raw_data());
    p.c = c0 + i * M * N;
    p.ldc = N;
    p.M = M;
    p.K = K;
    p.N = N;
    problems.push_back(p);
  }
  amx_gemm::gemm(problems);
}

}  // namespace

void Matmul::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  if (use_amx(out[0], in[0].dim(-1))) return matmul_amx(in[0], in[1], out[0]);
  run_gemm("matmul", in[0], in[1], Tensor(), out[0], false);
}

void Linear::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor bias = has_bias_ ? in[2] : Tensor();
  if (use_amx(out[0], in[0].dim(-1))) return linear_amx(in[0], in[1], bias, out[0]);
  // weight[N, K] seen as [K, N] (a transposed view, no copy) is oneDNN's weights operand.
  run_gemm("linear", in[0], in[1].transpose(0, 1), bias, out[0], true);
}

}  // namespace tessera
