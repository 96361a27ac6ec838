// SDPA on CPU. Tiled path: per (batch, head, block of queries), stream blocks of keys; the two
// tile GEMMs (Q K^T and P V) run through oneDNN matmul (AMX / AVX512-BF16 / AVX-512 picked by
// oneDNN at run time), the online softmax in between by our own row kernels. The reference path
// is plain loops, one query row at a time (no L x L buffer either); it serves
// TESSERA_CPU_ISA=scalar and the tests that check one path against the other. See
// docs/decisions/0003-attention-kernel.md.
#include "ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "backends/cpu/attention/attention_kernels.h"
#include "backends/cpu/gemm/gemm_small.h"
#include "backends/cpu/onednn_util.h"
#include "ops/copy.h"
#include "runtime/cpu_features.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/parallel.h"

namespace tessera {
namespace cpu {
namespace {
std::atomic<AttentionPath> g_path{AttentionPath::automatic};
}
void set_attention_path(AttentionPath p) {
  g_path = p;
}
AttentionPath attention_path() {
  return g_path;
}

float exp_u20_scalar(float x) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const float ln_min = bits(0xc2aeac50u), ln_max = bits(0x42b17218u);
  const bool underflow = x < ln_min;
  float src = std::max(std::min(x, ln_max), ln_min);
  const float fx = std::floor(std::fma(src, bits(0x3fb8aa3bu), 0.5f));
  const float r = std::fma(-fx, bits(0x3f317218u), src);
  float p = std::fma(r, 0.00828929059f, 0.0418978221f);
  p = std::fma(r, p, 0.166676521f);
  p = std::fma(r, p, 0.499991506f);
  p = std::fma(r, p, 0.999999701f);
  p = std::fma(r, p, 1.f);
  const int32_t e = int32_t(fx - 1.f) + 127;
  const float scale = underflow ? 0.f : bits(uint32_t(e) << 23);
  return p * scale * 2.f;
}

float softmax_row_scalar(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                         float* m, float* l, void* p, bool p_bf16) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  float mx = *m;
  for (int64_t j = 0; j < nvalid; ++j) {
    s[j] = s[j] * scale + (add ? add[j] : 0.f);
    mx = std::max(mx, s[j]);
  }
  if (mx == ninf) {  // nothing visible yet: contribute zeros, keep the accumulator
    if (p_bf16)
      std::memset(p, 0, size_t(n) * 2);
    else
      std::memset(p, 0, size_t(n) * 4);
    return 1.f;
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t vec_end = n - n % 16;
    const float e = j >= nvalid   ? 0.f
                    : j < vec_end ? exp_u20_scalar(s[j] - mx)
                                  : std::exp(s[j] - mx);
    sum += e;
    if (p_bf16)
      static_cast<uint16_t*>(p)[j] = f32_to_bf16(e);
    else
      static_cast<float*>(p)[j] = e;
  }
  const float alpha = std::exp(*m - mx);  // exp(-inf) = 0 on the first block
  *l = *l * alpha + sum;
  *m = mx;
  return alpha;
}

bool sdpa_tiles_on_small_gemm(int64_t D, int64_t KB) {
  static const bool avx2 = cpu_isa() == CpuIsa::avx2;
  return avx2 && D * KB <= (int64_t(1) << 16);
}

SmallGemm sdpa_qk_tile(const SdpaArgs& a, const char* q, int64_t qn, int64_t kn, const float* kt,
                       int64_t ld, float* s) {
  SmallGemm g;
  g.a = reinterpret_cast<const float*>(q);
  g.lda = a.qs[2];
  g.b = kt;
  g.ldb = ld;
  g.c = s;
  g.ldc = ld;
  g.M = qn;
  g.N = kn;
  g.K = a.D;
  return g;
}

SmallGemm sdpa_pv_tile(const SdpaArgs& a, const float* p, int64_t ld, const char* v, int64_t qn,
                       int64_t kn, float* acc) {
  SmallGemm g;
  g.a = p;
  g.lda = ld;
  g.b = reinterpret_cast<const float*>(v);
  g.ldb = a.vs[2];
  g.accumulate = true;
  g.c = acc;
  g.ldc = a.Dv;
  g.M = qn;
  g.N = a.Dv;
  g.K = kn;
  return g;
}

SoftmaxRowFn softmax_row_for_cpu() {
  switch (cpu_isa()) {
    case CpuIsa::scalar:
      return softmax_row_scalar;
    case CpuIsa::avx2:
      return softmax_row_avx2;
    case CpuIsa::avx512:
      return softmax_row_avx512;
    default:
      return softmax_row_avx512bf16;
  }
}

void sdpa_mask_row(const SdpaArgs& a, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                   float* add) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const size_t es = dtype_size(a.mask_dtype);
  const char* base =
      a.mask + (b * a.ms[0] + h * a.ms[1] + i * a.ms[2] + j0 * a.ms[3]) * int64_t(es);
  if (a.mask_dtype == DType::boolean) {
    for (int64_t j = 0; j < n; ++j) add[j] = base[j * a.ms[3]] ? 0.f : ninf;
  } else if (a.ms[3] == 1) {
    convert_elements(base, a.mask_dtype, add, DType::f32, size_t(n));
  } else {
    for (int64_t j = 0; j < n; ++j)
      convert_elements(base + j * a.ms[3] * int64_t(es), a.mask_dtype, add + j, DType::f32, 1);
  }
}

}  // namespace cpu

namespace {
using cpu::AttentionPath;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using cpu::SdpaArgs;

DType elem_type(const SdpaArgs& a) {
  return a.bf16 ? DType::bf16 : DType::f32;
}

// ---- reference: one query row at a time, two passes over the keys ------------------------------
void sdpa_reference(const SdpaArgs& a) {
  const int64_t rep = a.H / a.Hkv;
  parallel_for(a.B * a.H * a.Lq, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> q(a.D), kr(a.D), vr(a.Dv), s(a.Lk), add(a.Lk), acc(a.Dv);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % a.Lq, h = (r / a.Lq) % a.H, b = r / (a.Lq * a.H), hk = h / rep;
      convert_elements(a.qrow(b, h, i), elem_type(a), q.data(), DType::f32, size_t(a.D));
      if (a.mask) cpu::sdpa_mask_row(a, b, h, i, 0, a.Lk, add.data());
      const int64_t nvalid = a.causal ? std::min(i + 1, a.Lk) : a.Lk;
      float mx = kNegInf;
      for (int64_t j = 0; j < a.Lk; ++j) {
        float x = kNegInf;
        if (j < nvalid) {
          convert_elements(a.krow(b, hk, j), elem_type(a), kr.data(), DType::f32, size_t(a.D));
          double dot = 0;  // the reference sums exactly enough to sit within torch's own error
          for (int64_t d = 0; d < a.D; ++d) dot += double(q[d]) * double(kr[d]);
          x = float(dot) * a.scale + (a.mask ? add[j] : 0.f);
        }
        s[j] = x;
        mx = std::max(mx, x);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float sum = 0;
      if (mx != kNegInf) {
        for (int64_t j = 0; j < a.Lk; ++j) {
          if (s[j] == kNegInf) continue;
          const int64_t blk = j - j % cpu::kSdpaKeyBlock;
          const int64_t kn = std::min(cpu::kSdpaKeyBlock, a.Lk - blk);
          float p = j - blk < kn - kn % 16 ? cpu::exp_u20_scalar(s[j] - mx) : std::exp(s[j] - mx);
          sum += p;
          if (a.bf16) p = round_bf16(p);  // torch feeds P to the PV GEMM in the input dtype
          convert_elements(a.vrow(b, hk, j), elem_type(a), vr.data(), DType::f32, size_t(a.Dv));
          for (int64_t d = 0; d < a.Dv; ++d) acc[d] += p * vr[d];
        }
      }
      const float inv = sum > 0 ? 1.f / sum : 0.f;  // fully masked rows give 0, as torch
      for (int64_t d = 0; d < a.Dv; ++d) acc[d] *= inv;
      convert_elements(acc.data(), DType::f32, a.orow(b, h, i), elem_type(a), size_t(a.Dv));
    }
  });
}

// ---- tiled: oneDNN tile GEMMs + online softmax
// ---------------------------------------------------
struct GemmKey {
  bool bf16;
  int64_t M, N, K, lda, ldb, ldc;
  bool b_transposed, accumulate;
  auto tie() const { return std::tie(bf16, M, N, K, lda, ldb, ldc, b_transposed, accumulate); }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct Gemm {
  bool supported = false;  // oneDNN has a kernel for these operands (bf16 needs AVX-512)
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, scratch;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// C (M x N, f32, row stride ldc) [+]= A (M x K, row stride lda) * B (K x N); B is stored as rows
// of K (b_transposed: N rows of length K with stride ldb, i.e. keys) or rows of N (values).
const Gemm& get_gemm(const GemmKey& key) {
  static std::mutex mu;
  static std::map<GemmKey, std::unique_ptr<Gemm>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[key];
  if (!slot) {
    using md = dnnl::memory::desc;
    const auto dt = key.bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
    auto g = std::make_unique<Gemm>();
    g->a = md({key.M, key.K}, dt, dnnl::memory::dims{key.lda, 1});
    g->b = key.b_transposed ? md({key.K, key.N}, dt, dnnl::memory::dims{1, key.ldb})
                            : md({key.K, key.N}, dt, dnnl::memory::dims{key.ldb, 1});
    g->c = md({key.M, key.N}, dnnl::memory::data_type::f32, dnnl::memory::dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    try {
      // Tiles run inside one (batch, head, q-block) task: made for one thread, so a tile run
      // outside a parallel region (a small attention, decision 0017) does not fork.
      onednn::sync_threads(1);
      auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(g->a, g->b, g->c), attr, engine());
      g->scratch = pd.scratchpad_desc();
      g->prim = dnnl::matmul(pd);
      g->supported = true;
    } catch (const dnnl::error&) {
      g->supported = false;
    }
    slot = std::move(g);
  }
  return *slot;
}

// One of this thread's tile buffers (slot 0-6), kept between calls and grown when too small: a
// fresh allocation per call of tiles this large came back from the kernel as new pages, and the
// page faults cost more than small attentions' arithmetic. Kept until the thread exits.
struct TileBuf {
  void* p = nullptr;
  TileBuf(int slot, size_t bytes) {
    struct Slot {
      void* p = nullptr;
      size_t cap = 0;
      ~Slot() { std::free(p); }
    };
    thread_local Slot slots[7];
    Slot& s = slots[slot];
    if (bytes > s.cap) {
      std::free(s.p);
      s.cap = 0;
      s.p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
      TESSERA_CHECK(s.p, "[scaled_dot_product_attention] out of memory for a ", bytes,
                    "-byte tile");
      s.cap = bytes;
    }
    p = s.p;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

void sdpa_tiled(const SdpaArgs& a, bool avx512) {
  // Query blocks of 256 rows amortise oneDNN's repacking of each K/V block (overridable for
  // tuning); key blocks are torch's 512, which the exp emulation depends on.
  static const int64_t kQB = *env::integer(EnvVar::sdpa_qblock);
  const int64_t QB = std::min(kQB, a.Lq), KB = std::min(cpu::kSdpaKeyBlock, a.Lk);
  const int64_t nqb = (a.Lq + QB - 1) / QB, rep = a.H / a.Hkv;
  const size_t es = a.es();
  auto qk_gemm = [&](int64_t m, int64_t n) -> const Gemm& {
    return get_gemm({a.bf16, m, n, a.D, a.qs[2], a.ks[2], KB, true, false});
  };
  auto pv_gemm = [&](int64_t m, int64_t n) -> const Gemm& {
    return get_gemm({a.bf16, m, a.Dv, n, KB, a.vs[2], a.Dv, false, true});
  };
  // f32 tiles on AVX2 run on our small GEMM (gemm_small.h), in eager and prepared SDPA alike;
  // elsewhere on oneDNN. Every oneDNN tile shape (full blocks and the tails) is made up front.
  const bool small = !a.bf16 && cpu::sdpa_tiles_on_small_gemm(a.D, KB);
  size_t scratch_bytes = 0;
  for (int64_t m : {QB, a.Lq % QB})
    for (int64_t n : {KB, a.Lk % KB}) {
      if (m == 0 || n == 0 || small) continue;
      scratch_bytes = std::max(
          {scratch_bytes, qk_gemm(m, n).scratch.get_size(), pv_gemm(m, n).scratch.get_size()});
    }
  const cpu::SoftmaxRowFn row_fn = cpu::softmax_row_for_cpu();

  parallel_for(a.B * a.H * nqb, cpu::sdpa_task_grain(a, QB), [&](int64_t begin, int64_t end) {
    dnnl::stream stream(engine());
    const TileBuf S(0, size_t(QB * KB) * 4), P(1, size_t(QB * KB) * es),
        acc(2, size_t(QB * a.Dv) * 4), ml(3, size_t(QB) * 8), add(4, size_t(KB) * 4),
        scratch(5, std::max<size_t>(scratch_bytes, 64)), kt(6, small ? size_t(a.D * KB) * 4 : 64);
    float* m = ml.as<float>();
    float* l = m + QB;
    auto run = [&](const Gemm& g, const void* A, const void* Bm, void* C) {
      TESSERA_CHECK(g.supported, "[scaled_dot_product_attention] the kernel library has no ",
                    a.bf16 ? "bf16" : "f32", " tile GEMM on this CPU");
      dnnl::memory ma(g.a, engine(), const_cast<void*>(A)),
          mb(g.b, engine(), const_cast<void*>(Bm)), mc(g.c, engine(), C),
          msp(g.scratch, engine(), scratch.p);
      g.prim.execute(stream, {{DNNL_ARG_SRC, ma},
                              {DNNL_ARG_WEIGHTS, mb},
                              {DNNL_ARG_DST, mc},
                              {DNNL_ARG_SCRATCHPAD, msp}});
    };
    for (int64_t w = begin; w < end; ++w) {
      const int64_t qb_i = w % nqb, h = (w / nqb) % a.H, b = w / (nqb * a.H), hk = h / rep;
      const int64_t q0 = qb_i * QB, qn = std::min(QB, a.Lq - q0);
      std::fill(m, m + qn, kNegInf);
      std::fill(l, l + qn, 0.f);
      std::memset(acc.p, 0, size_t(qn * a.Dv) * 4);
      const int64_t kend = a.causal ? std::min(a.Lk, q0 + qn) : a.Lk;
      for (int64_t k0 = 0; k0 < kend; k0 += KB) {
        const int64_t kn = std::min(KB, a.Lk - k0);
        if (small) {  // S = Q x K^T, the key tile transposed into rows of keys first
          cpu::transpose_f32(reinterpret_cast<const float*>(a.krow(b, hk, k0)), a.ks[2], kn, a.D,
                             kt.as<float>(), KB);
          cpu::small_gemm_f32(
              cpu::sdpa_qk_tile(a, a.qrow(b, h, q0), qn, kn, kt.as<float>(), KB, S.as<float>()), 0,
              qn);
        } else {
          run(qk_gemm(qn, kn), a.qrow(b, h, q0), a.krow(b, hk, k0), S.p);
        }
        for (int64_t r = 0; r < qn; ++r) {
          const int64_t i = q0 + r;
          const int64_t nvalid = a.causal ? std::clamp<int64_t>(i - k0 + 1, 0, kn) : kn;
          const float* addp = nullptr;
          if (a.mask && nvalid > 0) {
            cpu::sdpa_mask_row(a, b, h, i, k0, nvalid, add.as<float>());
            addp = add.as<float>();
          }
          const float alpha = row_fn(S.as<float>() + r * KB, kn, nvalid, a.scale, addp, m + r,
                                     l + r, P.as<char>() + size_t(r * KB) * es, a.bf16);
          if (a.round_p_bf16) cpu::round_row_bf16(P.as<float>() + r * KB, kn);
          if (alpha != 1.f) cpu::scale_row(acc.as<float>() + r * a.Dv, a.Dv, alpha, avx512);
        }
        if (small)
          cpu::small_gemm_f32(
              cpu::sdpa_pv_tile(a, P.as<float>(), KB, a.vrow(b, hk, k0), qn, kn, acc.as<float>()),
              0, qn);
        else
          run(pv_gemm(qn, kn), P.p, a.vrow(b, hk, k0), acc.p);
      }
      for (int64_t r = 0; r < qn; ++r)
        cpu::finish_row(acc.as<float>() + r * a.Dv, a.Dv, l[r], a.orow(b, h, q0 + r), a.bf16,
                        avx512);
    }
  });
}

// The tile GEMMs need rows: unit stride in the last dim and a row stride of at least a row.
// Other layouts (e.g. (B, L, H, D) permuted to (B, H, L, D)) are read in place.
Tensor unit_last_stride(const Tensor& t) {
  const bool rows_ok =
      (t.dim(3) == 1 || t.strides()[3] == 1) && (t.dim(2) == 1 || t.strides()[2] >= t.dim(3));
  if (rows_ok) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  std::vector<Tensor> outs = {c};
  Copy().eval_cpu({t}, outs);
  return c;
}

// A bf16 call where oneDNN has no bf16 tile GEMM: the same arithmetic on f32 tiles. bf16 x bf16
// products are exact in f32 and both GEMMs accumulate in f32, so only the summation order can
// differ; P and the output are rounded to bf16 where the bf16 kernel rounds them.
void sdpa_tiled_bf16_on_f32(const SdpaArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                            Tensor& out, bool avx512) {
  auto to_f32 = [](const Tensor& t) {
    std::vector<Tensor> o{Tensor::empty(t.shape(), DType::f32)};
    Copy().eval_cpu({t}, o);
    return o[0];
  };
  const Tensor q32 = to_f32(q), k32 = to_f32(k), v32 = to_f32(v);
  Tensor out32 = Tensor::empty(out.shape(), DType::f32);
  SdpaArgs f = cpu::bf16_call_on_f32(a);
  f.q = static_cast<const char*>(q32.raw_data());
  f.k = static_cast<const char*>(k32.raw_data());
  f.v = static_cast<const char*>(v32.raw_data());
  f.out = static_cast<char*>(out32.raw_data());
  sdpa_tiled(f, avx512);
  convert_elements(out32.raw_data(), DType::f32, out.raw_data(), DType::bf16, size_t(out.numel()));
}

}  // namespace

void ScaledDotProductAttention::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor q = unit_last_stride(in[0]), k = unit_last_stride(in[1]),
               v = unit_last_stride(in[2]);
  SdpaArgs a;
  a.bf16 = q.dtype() == DType::bf16;
  a.B = q.dim(0), a.H = q.dim(1), a.Lq = q.dim(2), a.D = q.dim(3);
  a.Hkv = k.dim(1), a.Lk = k.dim(2), a.Dv = v.dim(3);
  a.q = static_cast<const char*>(q.raw_data());
  a.k = static_cast<const char*>(k.raw_data());
  a.v = static_cast<const char*>(v.raw_data());
  for (int i = 0; i < 3; ++i)
    a.qs[i] = q.strides()[i], a.ks[i] = k.strides()[i], a.vs[i] = v.strides()[i];
  // A length-1 dim may carry any stride; give the GEMMs a plain row stride.
  if (a.Lq == 1) a.qs[2] = a.D;
  if (a.Lk == 1) a.ks[2] = a.D, a.vs[2] = a.Dv;
  a.out = static_cast<char*>(out[0].raw_data());
  a.causal = causal_;
  a.scale = float(scale_);
  if (has_mask_) {
    const Tensor& mk = in[3];
    a.mask = static_cast<const char*>(mk.raw_data());
    a.mask_dtype = mk.dtype();
    for (int i = 0; i < 4; ++i) a.ms[i] = mk.strides()[i];
  }
  if (a.B * a.H * a.Lq == 0 || a.Dv == 0) return;
  if (a.Lk == 0) {  // no keys: every row is fully masked
    std::memset(a.out, 0, out[0].nbytes());
    return;
  }
  AttentionPath path = cpu::attention_path();
  if (path == AttentionPath::automatic)
    path = cpu_isa() == CpuIsa::scalar ? AttentionPath::reference : AttentionPath::amx;
  if (path == AttentionPath::reference) sdpa_reference(a);
  // The AMX kernels are only entered on AMX CPUs: their files are built for AVX-512, and under
  // AddressSanitizer even a function's prologue may use those instructions.
  else if (path == AttentionPath::tiled || cpu_isa() < CpuIsa::amx_bf16 ||
           !(a.bf16 ? cpu::sdpa_amx(a) : cpu::sdpa_amx_f32(a))) {
    const bool avx512 = cpu_isa() >= CpuIsa::avx512;
    if (a.bf16 && !onednn::has_bf16_matmul())
      sdpa_tiled_bf16_on_f32(a, q, k, v, out[0], avx512);
    else
      sdpa_tiled(a, avx512);
  }
}

}  // namespace tessera
