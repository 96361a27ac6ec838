// Linear prepared once for a compiled program (runtime/compile.cpp, decision 0010): the oneDNN
// primitive, its memory objects, argument map and scratchpad are made at prepare time, so a run
// only swaps data pointers in. Eager's run_gemm (gemm.cpp) builds a string key, three memory
// descriptors, a packed-weight lookup and an argument map per call, which is most of a small
// GEMM's cost. The primitive is created from the same descriptors, so the kernel and its results
// are eager's; bf16 on AMX keeps eager's own tile kernel with the packed weight remembered.
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "backends/cpu/gemm/gemm_amx.h"
#include "backends/cpu/gemm/gemm_small.h"
#include "backends/cpu/onednn_util.h"
#include "ops/copy.h"
#include "ops/linalg.h"
#include "runtime/cpu_features.h"
#include "runtime/parallel.h"
#include "runtime/random.h"

namespace tessera {
namespace {

// The weight's packed form per bound weight storage, so the packed-weight cache (string keys,
// a lock) is asked once per weight: a regional program binds each layer's weight in turn.
template <typename Packed>
class WeightMemo {
 public:
  template <typename Make>
  const Packed& get(const Tensor& w, Make&& make) {
    const auto& s = w.impl()->storage;
    for (Entry& e : entries_)
      if (e.storage == s.get() && e.offset == w.offset() && !e.owner.expired()) return e.packed;
    // Entries of released weights (offload) go at once, so no packed copy outlives its weight.
    std::erase_if(entries_, [](const Entry& e) { return e.owner.expired(); });
    if (entries_.size() >= 64) entries_.erase(entries_.begin());
    entries_.push_back(Entry{s.get(), s, w.offset(), make()});
    return entries_.back().packed;
  }

 private:
  struct Entry {
    const Storage* storage;
    std::weak_ptr<Storage> owner;  // a dead storage's address may be reused
    int64_t offset;
    Packed packed;
  };
  std::vector<Entry> entries_;
};

// oneDNN path (f32; bf16 where AMX is off). Mirrors gemm.cpp's run_gemm for linear.
class PreparedLinearOneDnn final : public PreparedKernel {
 public:
  // pack: let oneDNN choose the weights' layout (false: the weight as given, as eager's bf16
  // fallback runs it).
  static std::unique_ptr<PreparedLinearOneDnn> make(const Tensor& x, const Tensor& w,
                                                    const Tensor& bias, const Tensor& out,
                                                    bool pack = true) {
    auto k = std::make_unique<PreparedLinearOneDnn>();
    const Tensor b = w.transpose(0, 1);
    k->threads_ = onednn::gemm_threads(out.numel() * x.dim(-1));  // as eager's run_gemm
    onednn::sync_threads(k->threads_);
    try {
      k->a_md_ = onednn::view_desc(x, "linear");
      k->b_md_ = onednn::view_desc(b, "linear");
      k->d_md_ = onednn::view_desc(out, "linear");
      const dnnl::memory::desc w_md =
          pack ? dnnl::memory::desc(dnnl::memory::dims(b.shape().begin(), b.shape().end()),
                                    onednn::data_type(b.dtype(), "linear"),
                                    dnnl::memory::format_tag::any)
               : k->b_md_;
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::matmul::primitive_desc pd;
      if (bias.defined()) {
        const Shape bd{1, out.dim(1)};
        k->bias_md_ = onednn::view_desc(bd, contiguous_strides(bd), bias.dtype(), "linear");
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(k->a_md_, w_md, k->bias_md_, k->d_md_),
                                          attr, onednn::engine());
      } else {
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(k->a_md_, w_md, k->d_md_), attr,
                                          onednn::engine());
      }
      k->packed_md_ = pd.weights_desc();
      k->pack_ = k->packed_md_ != k->b_md_;
      k->prim_ = dnnl::matmul(pd);
      const auto& eng = onednn::engine();
      k->src_ = dnnl::memory(k->a_md_, eng, nullptr);
      k->dst_ = dnnl::memory(k->d_md_, eng, nullptr);
      if (!k->pack_) k->wmem_ = dnnl::memory(k->b_md_, eng, nullptr);
      if (bias.defined()) k->bias_ = dnnl::memory(k->bias_md_, eng, nullptr);
      k->scratch_ = dnnl::memory(pd.scratchpad_desc(), eng);
    } catch (const dnnl::error&) {
      return nullptr;  // no kernel for these operands: eval_cpu's fallback handles it
    }
    return k;
  }

  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    src_.set_data_handle(const_cast<void*>(x.raw_data()));
    dst_.set_data_handle(out[0].raw_data());
    dnnl::memory wm;
    if (pack_) {
      wm = memo_.get(w,
                     [&] { return onednn::packed_weights(w.transpose(0, 1), b_md_, packed_md_); });
    } else {
      wmem_.set_data_handle(const_cast<void*>(w.raw_data()));
      wm = wmem_;
    }
    std::unordered_map<int, dnnl::memory>& args = args_;
    if (args.empty()) {
      args = {{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}, {DNNL_ARG_SCRATCHPAD, scratch_}};
      if (in.size() > 2) args[DNNL_ARG_BIAS] = bias_;
    }
    args[DNNL_ARG_WEIGHTS] = wm;
    if (in.size() > 2) bias_.set_data_handle(const_cast<void*>(in[2].raw_data()));
    onednn::sync_threads(threads_);
    prim_.execute(onednn::stream(), args);
    onednn::stream().wait();
  }

 private:
  dnnl::memory::desc a_md_, b_md_, d_md_, bias_md_, packed_md_;
  bool pack_ = false;
  int threads_ = 1;
  dnnl::matmul prim_;
  dnnl::memory src_, dst_, wmem_, bias_, scratch_;
  std::unordered_map<int, dnnl::memory> args_;
  WeightMemo<dnnl::memory> memo_;
};

// bf16 where oneDNN has no bf16 kernel (no AVX-512): gemm.cpp's fallback, an f32 product on
// converted operands rounded once, with the f32 buffers kept and the weight converted once per
// bound weight.
class PreparedLinearBf16OnF32 final : public PreparedKernel {
 public:
  static std::unique_ptr<PreparedKernel> make(const Tensor& x, const Tensor& w, bool has_bias,
                                              const Tensor& out) {
    if (!out.is_contiguous()) return nullptr;
    auto k = std::make_unique<PreparedLinearBf16OnF32>();
    const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    k->x32_ = Tensor::empty({M, K}, DType::f32);
    k->out32_ = Tensor::empty({M, N}, DType::f32);
    if (has_bias) k->bias32_ = Tensor::empty({N}, DType::f32);
    // Eager converts weight.T into a contiguous [K, N]; seen as [N, K] it is that transposed.
    const Tensor w_proto = Tensor::empty({K, N}, DType::f32).transpose(0, 1);
    k->f32_ = PreparedLinearOneDnn::make(k->x32_, w_proto, k->bias32_, k->out32_, false);
    if (!k->f32_) return nullptr;
    return k;
  }

  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const Tensor& w = in[1];
    const Tensor& w32 = memo_.get(w, [&] {
      std::vector<Tensor> t{Tensor::empty({w.dim(1), w.dim(0)}, DType::f32)};
      Copy().eval_cpu({w.transpose(0, 1)}, t);
      return t[0];
    });
    std::vector<Tensor> x_out{x32_};
    Copy().eval_cpu({in[0]}, x_out);
    std::vector<Tensor> args{x32_, w32.transpose(0, 1)};
    if (bias32_.defined()) {
      std::vector<Tensor> b_out{bias32_};
      Copy().eval_cpu({in[2]}, b_out);
      args.push_back(bias32_);
    }
    std::vector<Tensor> o{out32_};
    f32_->run(args, o);
    convert_elements(out32_.raw_data(), DType::f32, out[0].raw_data(), DType::bf16,
                     size_t(out[0].numel()));
  }

 private:
  Tensor x32_, bias32_, out32_;
  std::unique_ptr<PreparedLinearOneDnn> f32_;
  WeightMemo<Tensor> memo_;
};

// bf16 on AMX: gemm.cpp's linear_amx with the packed weight and the f32 bias buffer kept.
class PreparedLinearAmx final : public PreparedKernel {
 public:
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    const bool has_bias = in.size() > 2;
    if (has_bias) {
      bias_.resize(size_t(in[2].numel()));
      convert_elements(in[2].raw_data(), in[2].dtype(), bias_.data(), DType::f32, bias_.size());
    }
    const auto& packed = memo_.get(w, [&] { return amx_gemm::packed_weight(w); });
    amx_gemm::Problem& p = problem_[0];
    p.a = static_cast<const uint16_t*>(x.raw_data());
    p.sam = x.strides()[0];
    p.sak = x.strides()[1];
    p.b_packed = packed.get();
    p.bias = has_bias ? bias_.data() : nullptr;
    p.c = static_cast<uint16_t*>(out[0].raw_data());
    p.ldc = out[0].dim(1);
    p.M = x.dim(0);
    p.K = x.dim(1);
    p.N = w.dim(0);
    amx_gemm::gemm(problem_);
  }

 private:
  std::vector<float> bias_;
  std::vector<amx_gemm::Problem> problem_ = std::vector<amx_gemm::Problem>(1);
  WeightMemo<std::shared_ptr<const uint16_t>> memo_;
};

// Small f32 products (the dispatch-bound models' layers) on our AVX-512 / AVX2 kernels, which
// compute oneDNN's bits for them (gemm_small.h) without a library call: the weight transposed once
// per bound weight into rows of N, the rows split over threads only when there is enough work.
class PreparedLinearSmall final : public PreparedKernel {
 public:
  static constexpr int64_t kMaxMacs = int64_t(1) << 22, kMaxWeight = int64_t(1) << 18;
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    const Tensor& wt = memo_.get(w, [&] {
      Tensor t = Tensor::empty({K, N}, DType::f32);
      const float* src = static_cast<const float*>(w.raw_data());
      float* dst = static_cast<float*>(t.raw_data());
      const int64_t s0 = w.strides()[0], s1 = w.strides()[1];
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) dst[k * N + n] = src[n * s0 + k * s1];
      return t;
    });
    cpu::SmallGemm g;
    g.a = static_cast<const float*>(x.raw_data());
    g.lda = K == 1 ? 1 : x.strides()[0];
    g.b = static_cast<const float*>(wt.raw_data());
    g.ldb = N;
    g.bias = in.size() > 2 ? static_cast<const float*>(in[2].raw_data()) : nullptr;
    g.c = static_cast<float*>(out[0].raw_data());
    g.ldc = N;
    g.M = M;
    g.N = N;
    g.K = K;
    const int64_t blocks = (M + 3) / 4;
    parallel_for(blocks, grain_for_work(4 * N * K), [&](int64_t b0, int64_t b1) {
      cpu::small_gemm_f32(g, b0 * 4, std::min(M, b1 * 4));
    });
  }

 private:
  WeightMemo<Tensor> memo_;
};

}  // namespace

std::unique_ptr<PreparedKernel> Linear::prepare_cpu(const std::vector<Tensor>& in,
                                                    const std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  if (out[0].numel() == 0 || x.dim(1) == 0) return nullptr;
  // Must match gemm.cpp's use_amx: the same kernel as eager, so the same bits.
  static const bool amx = cpu_isa() >= CpuIsa::amx_bf16;
  if (amx && out[0].dtype() == DType::bf16 && amx_gemm::enabled() && x.dim(1) > 64)
    return std::make_unique<PreparedLinearAmx>();
  const int64_t M = x.dim(0), K = x.dim(1), N = in[1].dim(0);
  const bool small_ok = cpu::small_gemm_available();
  if (out[0].dtype() == DType::bf16 && !onednn::has_bf16_matmul())
    return PreparedLinearBf16OnF32::make(x, in[1], has_bias_, out[0]);
  if (!small_ok || out[0].dtype() != DType::f32 || x.dtype() != DType::f32 || !x.is_contiguous() ||
      !out[0].is_contiguous() || M * N * K > PreparedLinearSmall::kMaxMacs ||
      N * K > PreparedLinearSmall::kMaxWeight)
    return PreparedLinearOneDnn::make(x, in[1], has_bias_ ? in[2] : Tensor(), out[0]);
  // The small kernel reproduces oneDNN's order for the shapes measured, but the library picks
  // its kernel by shape: probe each shape once per process on random data and keep oneDNN unless
  // the bits agree (remembered: deep models repeat a few shapes hundreds of times).
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t, bool>, bool> verdicts;
  const auto key = std::make_tuple(M, K, N, has_bias_);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = verdicts.find(key);
    if (it != verdicts.end()) {
      if (it->second) return std::make_unique<PreparedLinearSmall>();
      return PreparedLinearOneDnn::make(x, in[1], has_bias_ ? in[2] : Tensor(), out[0]);
    }
  }
  auto onednn = PreparedLinearOneDnn::make(x, in[1], has_bias_ ? in[2] : Tensor(), out[0]);
  if (!onednn) return onednn;
  auto small = std::make_unique<PreparedLinearSmall>();
  Generator g(0x5eed);
  std::vector<Tensor> probe{randn({M, K}, DType::f32, g), randn({N, K}, DType::f32, g)};
  if (has_bias_) probe.push_back(randn({N}, DType::f32, g));
  std::vector<Tensor> ref{Tensor::empty({M, N}, DType::f32)},
      got{Tensor::empty({M, N}, DType::f32)};
  onednn->run(probe, ref);
  small->run(probe, got);
  const bool same = std::memcmp(ref[0].raw_data(), got[0].raw_data(), size_t(M * N) * 4) == 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    verdicts[key] = same;
  }
  if (!same) return onednn;
  return small;
}

}  // namespace tessera
