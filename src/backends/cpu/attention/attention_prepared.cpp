// SDPA prepared once for a compiled program (runtime/compile.cpp, decision 0010): the tiled path
// of attention.cpp (oneDNN tile GEMMs + online softmax rows) with its tile primitives, memory
// objects, argument maps, stream and per-thread buffers made at prepare time. Eager's sdpa_tiled
// creates a stream, six buffers, and four memory objects plus an argument map per tile GEMM on
// every call, which on small attentions costs more than the arithmetic. The tile GEMMs are made
// from the same descriptors and the same row kernels run, so the results are eager's bits.
// Prepared only where eager takes the tiled path (not the AMX kernel, not the reference path).
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backends/cpu/attention/attention_kernels.h"
#include "backends/cpu/gemm/gemm_small.h"
#include "backends/cpu/onednn_util.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "runtime/cpu_features.h"
#include "runtime/env.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

using cpu::SdpaArgs;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)) {}
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// One tile GEMM shape, made as attention.cpp's get_gemm makes it.
struct TileGemm {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, scratch;
};

TileGemm make_gemm(bool bf16, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                   int64_t ldc, bool b_transposed, bool accumulate) {
  using md = dnnl::memory::desc;
  const auto dt = bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  TileGemm g;
  g.a = md({M, K}, dt, dnnl::memory::dims{lda, 1});
  g.b = b_transposed ? md({K, N}, dt, dnnl::memory::dims{1, ldb})
                     : md({K, N}, dt, dnnl::memory::dims{ldb, 1});
  g.c = md({M, N}, dnnl::memory::data_type::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  onednn::sync_threads(1);  // as get_gemm: one thread per tile
  auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(g.a, g.b, g.c), attr, engine());
  g.scratch = pd.scratchpad_desc();
  g.prim = dnnl::matmul(pd);
  return g;
}

class PreparedSdpa final : public PreparedKernel {
 public:
  // `a` holds the call's sizes and strides (pointers are set per run).
  PreparedSdpa(const SdpaArgs& a, bool avx512) : a_(a), avx512_(avx512) {
    static const int64_t kQB = *env::integer(EnvVar::sdpa_qblock);  // as attention.cpp
    QB_ = std::min(kQB, a.Lq);
    KB_ = std::min(cpu::kSdpaKeyBlock, a.Lk);
    nqb_ = (a.Lq + QB_ - 1) / QB_;
    // Tile shapes: index [m tail][n tail]; qk then pv.
    const int64_t ms[2] = {QB_, a.Lq % QB_}, ns[2] = {KB_, a.Lk % KB_};
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        if (ms[i] == 0 || ns[j] == 0) continue;
        auto& qk = gemms_[i][j][0];
        auto& pv = gemms_[i][j][1];
        qk = std::make_unique<TileGemm>(
            make_gemm(a.bf16, ms[i], ns[j], a.D, a.qs[2], a.ks[2], KB_, true, false));
        pv = std::make_unique<TileGemm>(
            make_gemm(a.bf16, ms[i], a.Dv, ns[j], KB_, a.vs[2], a.Dv, false, true));
        scratch_bytes_ = std::max({scratch_bytes_, qk->scratch.get_size(), pv->scratch.get_size()});
      }
    const bool small = !a.bf16 && cpu::small_gemm_available() && a.D * KB_ <= (int64_t(1) << 16);
    // oneDNN picks its kernel by shape and strides (a permuted K with another row stride can
    // sum in another order; AVX2's M = 256 tiles sum some rows otherwise): keep the small kernel
    // for Q K^T, and for P V, only if every tile shape gives its bits. Each distinct tile geometry
    // is probed once per process.
    static std::mutex mu;
    static std::map<std::vector<int64_t>, std::pair<bool, bool>> verdicts;
    const std::vector<int64_t> key{a.Lq, a.Lk, a.D, a.Dv, a.qs[2], a.ks[2], a.vs[2], QB_, KB_};
    if (small && cpu::sdpa_tiles_on_small_gemm(a.D, KB_)) {
      small_qk_ = small_pv_ = true;  // eager's tiles run on the same kernel
    } else if (small) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = verdicts.find(key);
      if (it != verdicts.end()) {
        std::tie(small_qk_, small_pv_) = it->second;
      } else {
        small_qk_ = small_pv_ = true;
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j)
            if (gemms_[i][j][0]) {
              small_qk_ = small_qk_ && probe(*gemms_[i][j][0], true, ms[i], ns[j]);
              small_pv_ = small_pv_ && probe(*gemms_[i][j][1], false, ms[i], ns[j]);
            }
        verdicts[key] = {small_qk_, small_pv_};
      }
    }
    row_fn_ = cpu::softmax_row_for_cpu();
  }

  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    SdpaArgs a = a_;
    a.q = static_cast<const char*>(in[0].raw_data());
    a.k = static_cast<const char*>(in[1].raw_data());
    a.v = static_cast<const char*>(in[2].raw_data());
    a.out = static_cast<char*>(out[0].raw_data());
    const int threads = std::max(1, num_threads());
    while (int64_t(ws_.size()) < threads) ws_.push_back(std::make_unique<Workspace>(*this));
    for (auto& w : ws_) w->kt_src = nullptr;  // new inputs may sit at the same addresses
    const int64_t rep = a.H / a.Hkv, es = int64_t(a.es());
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    parallel_for(a.B * a.H * nqb_, cpu::sdpa_task_grain(a, QB_), [&](int64_t begin, int64_t end) {
      const int t = omp_in_parallel() ? omp_get_thread_num() : 0;
      std::unique_ptr<Workspace> own;
      Workspace* w = t < int(ws_.size()) ? ws_[size_t(t)].get() : nullptr;
      if (!w) {  // called inside someone else's parallel region with more threads
        own = std::make_unique<Workspace>(*this);
        w = own.get();
      }
      float* m = w->ml.as<float>();
      float* l = m + QB_;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t qb_i = task % nqb_, h = (task / nqb_) % a.H, b = task / (nqb_ * a.H),
                      hk = h / rep;
        const int64_t q0 = qb_i * QB_, qn = std::min(QB_, a.Lq - q0);
        std::fill(m, m + qn, kNegInf);
        std::fill(l, l + qn, 0.f);
        std::memset(w->acc.p, 0, size_t(qn * a.Dv) * 4);
        const int64_t kend = a.causal ? std::min(a.Lk, q0 + qn) : a.Lk;
        for (int64_t k0 = 0; k0 < kend; k0 += KB_) {
          const int64_t kn = std::min(KB_, a.Lk - k0);
          const int mi = qn == QB_ ? 0 : 1, ni = kn == KB_ ? 0 : 1;
          if (small_qk_) {
            // Tasks of one head come in q-block order: their key tiles are transposed once.
            const char* kp = a.krow(b, hk, k0);
            if (w->kt_src != kp || w->kt_rows != kn) {
              transpose_keys(*w, a, kp, kn);
              w->kt_src = kp;
              w->kt_rows = kn;
            }
            qk_small(*w, a, a.qrow(b, h, q0), qn, kn);
          } else
            w->run(mi, ni, 0, a.qrow(b, h, q0), a.krow(b, hk, k0), w->S.p);
          for (int64_t r = 0; r < qn; ++r) {
            const int64_t i = q0 + r;
            const int64_t nvalid = a.causal ? std::clamp<int64_t>(i - k0 + 1, 0, kn) : kn;
            const float alpha = row_fn_(w->S.as<float>() + r * KB_, kn, nvalid, a.scale, nullptr,
                                        m + r, l + r, w->P.as<char>() + r * KB_ * es, a.bf16);
            if (a.round_p_bf16) cpu::round_row_bf16(w->P.as<float>() + r * KB_, kn);
            // The first key tile's accumulators are still zero: scaling them changes nothing.
            if (alpha != 1.f && k0 > 0)
              cpu::scale_row(w->acc.as<float>() + r * a.Dv, a.Dv, alpha, avx512_);
          }
          if (small_pv_)
            pv_small(*w, a, a.vrow(b, hk, k0), qn, kn);
          else
            w->run(mi, ni, 1, w->P.p, a.vrow(b, hk, k0), w->acc.p);
        }
        for (int64_t r = 0; r < qn; ++r)
          cpu::finish_row(w->acc.as<float>() + r * a.Dv, a.Dv, l[r], a.orow(b, h, q0 + r), a.bf16,
                          avx512_);
      }
    });
  }

 private:
  struct Workspace;
  // One tile product on random data through oneDNN and through qk_small / pv_small: equal bits?
  bool probe(const TileGemm& tg, bool qk, int64_t qn, int64_t kn) const {
    const SdpaArgs& a = a_;
    uint32_t state = 12345;
    auto fill = [&](std::vector<float>& v) {
      for (float& x : v) {
        state = state * 1664525u + 1013904223u;
        x = float(int32_t(state >> 8) - (1 << 23)) / float(1 << 23);
      }
    };
    Workspace w(*this);
    std::vector<float> A, B, C;
    if (qk) {
      A.resize(size_t(qn * a.qs[2] + a.D));
      B.resize(size_t(kn * a.ks[2] + a.D));
      C.assign(size_t(qn * KB_), 0.f);
    } else {
      A.resize(size_t(qn * KB_));
      B.resize(size_t(kn * a.vs[2] + a.Dv));
      C.resize(size_t(qn * a.Dv));
    }
    fill(A);
    fill(B);
    fill(C);
    std::vector<float> C2 = C;
    dnnl::memory ma(tg.a, engine(), A.data()), mb(tg.b, engine(), B.data()),
        mc(tg.c, engine(), C.data()), msp(tg.scratch, engine(), w.scratch.p);
    tg.prim.execute(w.stream, {{DNNL_ARG_SRC, ma},
                               {DNNL_ARG_WEIGHTS, mb},
                               {DNNL_ARG_DST, mc},
                               {DNNL_ARG_SCRATCHPAD, msp}});
    w.stream.wait();
    if (qk) {
      transpose_keys(w, a, reinterpret_cast<const char*>(B.data()), kn);
      qk_small(w, a, reinterpret_cast<const char*>(A.data()), qn, kn);
      for (int64_t r = 0; r < qn; ++r)
        if (std::memcmp(C.data() + r * KB_, w.S.as<float>() + r * KB_, size_t(kn) * 4))
          return false;
      return true;
    }
    std::memcpy(w.P.p, A.data(), A.size() * 4);
    std::memcpy(w.acc.p, C2.data(), C2.size() * 4);
    pv_small(w, a, reinterpret_cast<const char*>(B.data()), qn, kn);
    return std::memcmp(C.data(), w.acc.p, C.size() * 4) == 0;
  }
  // f32 on AVX-512 or AVX2: the tile products on gemm_small.h's kernels (oneDNN's order, so its
  // bits). K's tile transposed into rows of keys (KT).
  void transpose_keys(Workspace& w, const SdpaArgs& a, const char* k, int64_t kn) const {
    cpu::transpose_f32(reinterpret_cast<const float*>(k), a.ks[2], kn, a.D, w.KT.as<float>(), KB_);
  }
  // S[qn, kn] = Q rows x KT.
  void qk_small(Workspace& w, const SdpaArgs& a, const char* q, int64_t qn, int64_t kn) const {
    cpu::small_gemm_f32(cpu::sdpa_qk_tile(a, q, qn, kn, w.KT.as<float>(), KB_, w.S.as<float>()), 0,
                        qn);
  }
  // acc[qn, Dv] += P[qn, kn] x V rows.
  void pv_small(Workspace& w, const SdpaArgs& a, const char* v, int64_t qn, int64_t kn) const {
    cpu::small_gemm_f32(cpu::sdpa_pv_tile(a, w.P.as<float>(), KB_, v, qn, kn, w.acc.as<float>()), 0,
                        qn);
  }

  // Per-thread tile buffers, stream and bound memory objects for every tile GEMM.
  struct Workspace {
    explicit Workspace(const PreparedSdpa& s)
        : S(size_t(s.QB_ * s.KB_) * 4),
          P(size_t(s.QB_ * s.KB_) * s.a_.es()),
          acc(size_t(s.QB_ * s.a_.Dv) * 4),
          ml(size_t(s.QB_) * 8),
          scratch(std::max<size_t>(s.scratch_bytes_, 64)),
          KT(s.small_qk_ ? size_t(s.a_.D * s.KB_) * 4 : 64),
          stream(engine()) {
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          for (int g = 0; g < 2; ++g) {
            const TileGemm* tg = s.gemms_[i][j][g].get();
            if (!tg) continue;
            Bound& bd = bound[i][j][g];
            bd.gemm = tg;
            bd.a = dnnl::memory(tg->a, engine(), nullptr);
            bd.b = dnnl::memory(tg->b, engine(), nullptr);
            bd.c = dnnl::memory(tg->c, engine(), nullptr);
            bd.args = {{DNNL_ARG_SRC, bd.a},
                       {DNNL_ARG_WEIGHTS, bd.b},
                       {DNNL_ARG_DST, bd.c},
                       {DNNL_ARG_SCRATCHPAD, dnnl::memory(tg->scratch, engine(), scratch.p)}};
          }
    }
    void run(int mi, int ni, int g, const void* A, const void* B, void* C) {
      Bound& bd = bound[mi][ni][g];
      bd.a.set_data_handle(const_cast<void*>(A));
      bd.b.set_data_handle(const_cast<void*>(B));
      bd.c.set_data_handle(C);
      bd.gemm->prim.execute(stream, bd.args);
    }
    struct Bound {
      const TileGemm* gemm = nullptr;
      dnnl::memory a, b, c;
      std::unordered_map<int, dnnl::memory> args;
    };
    Buffer S, P, acc, ml, scratch, KT;
    const char* kt_src = nullptr;  // the key tile KT holds (reset at every run)
    int64_t kt_rows = 0;
    dnnl::stream stream;
    Bound bound[2][2][2];
  };

  SdpaArgs a_;
  bool avx512_;
  int64_t QB_ = 0, KB_ = 0, nqb_ = 0;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<TileGemm> gemms_[2][2][2];
  cpu::SoftmaxRowFn row_fn_ = nullptr;
  bool small_qk_ = false, small_pv_ = false;
  std::vector<std::unique_ptr<Workspace>> ws_;
};

// bf16 where oneDNN has no bf16 tile GEMM: attention.cpp's sdpa_tiled_bf16_on_f32 (f32 copies of
// Q, K, V, P rounded to bf16, the output rounded once) with the f32 buffers kept.
class PreparedSdpaBf16OnF32 final : public PreparedKernel {
 public:
  static std::unique_ptr<PreparedKernel> make(const SdpaArgs& bf16_args, const Tensor& q,
                                              const Tensor& k, const Tensor& v, const Tensor& out,
                                              bool avx512) {
    auto p = std::make_unique<PreparedSdpaBf16OnF32>();
    p->q32_ = Tensor::empty(q.shape(), DType::f32);
    p->k32_ = Tensor::empty(k.shape(), DType::f32);
    p->v32_ = Tensor::empty(v.shape(), DType::f32);
    p->out32_ = Tensor::empty(out.shape(), DType::f32);
    p->f32_ = std::make_unique<PreparedSdpa>(cpu::bf16_call_on_f32(bf16_args), avx512);
    return p;
  }

  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const Tensor* bufs[3] = {&q32_, &k32_, &v32_};
    for (int i = 0; i < 3; ++i) {
      std::vector<Tensor> o{*bufs[i]};
      Copy().eval_cpu({in[size_t(i)]}, o);
    }
    std::vector<Tensor> o{out32_};
    f32_->run({q32_, k32_, v32_}, o);
    convert_elements(out32_.raw_data(), DType::f32, out[0].raw_data(), DType::bf16,
                     size_t(out[0].numel()));
  }

 private:
  Tensor q32_, k32_, v32_, out32_;
  std::unique_ptr<PreparedSdpa> f32_;
};

bool rows_ok(const Tensor& t) {
  return (t.dim(3) == 1 || t.strides()[3] == 1) && (t.dim(2) == 1 || t.strides()[2] >= t.dim(3));
}

}  // namespace

std::unique_ptr<PreparedKernel> ScaledDotProductAttention::prepare_cpu(
    const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
  // Only what eager's automatic choice sends to sdpa_tiled without copies: f32 or bf16 where
  // sdpa_amx / sdpa_amx_f32 decline (no AMX, head dims not multiples of 32); no mask, row layouts,
  // non-empty, an ISA above scalar.
  if (has_mask_ || cpu::attention_path() != cpu::AttentionPath::automatic) return nullptr;
  if (cpu_isa() == CpuIsa::scalar) return nullptr;
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  if (!rows_ok(q) || !rows_ok(k) || !rows_ok(v)) return nullptr;
  const bool bf16 = q.dtype() == DType::bf16;
  if (!bf16 && q.dtype() != DType::f32) return nullptr;
  if (cpu_isa() >= CpuIsa::amx_bf16 && q.dim(3) % 32 == 0 && v.dim(3) % 32 == 0)
    return nullptr;  // eager runs the AMX kernels (bf16, split f32)
  SdpaArgs a;
  a.bf16 = bf16;
  a.B = q.dim(0), a.H = q.dim(1), a.Lq = q.dim(2), a.D = q.dim(3);
  a.Hkv = k.dim(1), a.Lk = k.dim(2), a.Dv = v.dim(3);
  for (int i = 0; i < 3; ++i)
    a.qs[i] = q.strides()[i], a.ks[i] = k.strides()[i], a.vs[i] = v.strides()[i];
  if (a.Lq == 1) a.qs[2] = a.D;
  if (a.Lk == 1) a.ks[2] = a.D, a.vs[2] = a.Dv;
  a.q = a.k = a.v = nullptr;
  a.out = nullptr;
  a.causal = causal_;
  a.scale = float(scale_);
  if (a.B * a.H * a.Lq == 0 || a.Dv == 0 || a.Lk == 0 || out[0].numel() == 0) return nullptr;
  try {
    if (bf16 && !onednn::has_bf16_matmul())
      return PreparedSdpaBf16OnF32::make(a, q, k, v, out[0], cpu_isa() >= CpuIsa::avx512);
    return std::make_unique<PreparedSdpa>(a, cpu_isa() >= CpuIsa::avx512);
  } catch (const dnnl::error&) {
    return nullptr;
  }
}

}  // namespace tessera
