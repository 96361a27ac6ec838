// CPU conv2d on oneDNN's convolution primitive: NCHW activations are reordered to the blocked
// layout the fastest kernel wants and back; weights are repacked once and cached. bf16 as in
// gemm.cpp: fp32 accumulation, one rounding, fp32 fallback where oneDNN has no bf16 kernel.
#include "ops/conv.h"

#include <unordered_map>

#include "backends/cpu/onednn_util.h"
#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {
namespace {

struct ConvEntry {
  bool supported = false;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  bool reorder_src = false, reorder_dst = false, pack_weights = false;
  dnnl::reorder src_reorder, dst_reorder;
  dnnl::memory::desc src_reorder_scratch, dst_reorder_scratch;
};

onednn::PrimitiveCache<ConvEntry>& conv_cache() {
  static onednn::PrimitiveCache<ConvEntry> c;
  return c;
}
[[maybe_unused]] const bool g_registered =
    (onednn::register_cache_clear([] { conv_cache().clear(); }), true);

void run_conv(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
              Tensor& out) {
  const char* op = "conv2d";
  if (out.numel() == 0) return;
  using dims = dnnl::memory::dims;
  const auto x_md = onednn::view_desc(x, op), d_md = onednn::view_desc(out, op);
  // Grouped weights are 5-D for oneDNN: (G, O/G, C/G, kh, kw).
  const int64_t g = p.groups;
  const Shape w_dims = g == 1 ? w.shape() : Shape{g, w.dim(0) / g, w.dim(1), w.dim(2), w.dim(3)};
  const Strides w_strides = g == 1 ? w.strides()
                                   : Strides{w.strides()[0] * (w.dim(0) / g), w.strides()[0],
                                             w.strides()[1], w.strides()[2], w.strides()[3]};
  const auto w_md = onednn::view_desc(w_dims, w_strides, w.dtype(), op);
  dnnl::memory::desc b_md;
  if (bias.defined()) b_md = onednn::view_desc(bias, op);
  onednn::KeyBuilder kb;
  kb.add(op).add(x).add(w).add(out).add(int64_t(bias.defined())).add(g);
  for (int i = 0; i < 2; ++i) kb.add(p.stride[i]).add(p.dilation[i]);
  for (int64_t v : p.padding) kb.add(v);
  onednn::sync_threads();  // before the primitive is made: oneDNN fixes its thread split then
  auto e = conv_cache().get(kb.str(), [&] {
    ConvEntry e;
    try {
      const auto dt = onednn::data_type(x.dtype(), op);
      const auto any = dnnl::memory::format_tag::any;
      const dnnl::memory::desc xa(dims(x.shape().begin(), x.shape().end()), dt, any),
          wa(dims(w_dims.begin(), w_dims.end()), dt, any),
          da(dims(out.shape().begin(), out.shape().end()), dt, any);
      const dims strides{p.stride[0], p.stride[1]}, dil{p.dilation[0] - 1, p.dilation[1] - 1},
          pad_l{p.padding[0], p.padding[2]}, pad_r{p.padding[1], p.padding[3]};
      const auto kind = dnnl::prop_kind::forward_inference;
      const auto alg = dnnl::algorithm::convolution_direct;
      // A user scratchpad: the cached primitives also run on the async stream's worker thread.
      const auto attr = onednn::user_scratchpad();
      const auto d = bias.defined() ? dnnl::convolution_forward::desc(kind, alg, xa, wa, b_md, da,
                                                                      strides, dil, pad_l, pad_r)
                                    : dnnl::convolution_forward::desc(kind, alg, xa, wa, da,
                                                                      strides, dil, pad_l, pad_r);
      e.pd = dnnl::convolution_forward::primitive_desc(d, attr, onednn::engine());
      e.prim = dnnl::convolution_forward(e.pd);
      e.reorder_src = e.pd.src_desc() != x_md;
      e.reorder_dst = e.pd.dst_desc() != d_md;
      e.pack_weights = e.pd.weights_desc() != w_md;
      const auto& eng = onednn::engine();
      if (e.reorder_src) {
        const dnnl::reorder::primitive_desc r(eng, x_md, eng, e.pd.src_desc(), attr);
        e.src_reorder = dnnl::reorder(r);
        e.src_reorder_scratch = r.scratchpad_desc();
      }
      if (e.reorder_dst) {
        const dnnl::reorder::primitive_desc r(eng, e.pd.dst_desc(), eng, d_md, attr);
        e.dst_reorder = dnnl::reorder(r);
        e.dst_reorder_scratch = r.scratchpad_desc();
      }
      e.supported = true;
    } catch (const dnnl::error&) {
      e.supported = false;
    }
    return e;
  });
  if (!e->supported) {
    TESSERA_CHECK(out.dtype() == DType::bf16, "[conv2d] the kernel library has no kernel for ",
                  x.describe(), " * ", w.describe(), "; expected f32 or bf16 operands");
    Tensor out32 = Tensor::empty(out.shape(), DType::f32);
    run_conv(p, astype(x, DType::f32), astype(w, DType::f32),
             bias.defined() ? astype(bias, DType::f32) : bias, out32);
    convert_elements(out32.raw_data(), DType::f32, out.raw_data(), DType::bf16,
                     size_t(out.numel()));
    return;
  }
  auto& s = onednn::stream();
  // Each primitive runs to completion before the next, so they share this thread's scratchpad.
  auto reorder = [&](const dnnl::reorder& r, const dnnl::memory::desc& scratch,
                     const dnnl::memory& from, const dnnl::memory& to) {
    r.execute(s, {{DNNL_ARG_FROM, from},
                  {DNNL_ARG_TO, to},
                  {DNNL_ARG_SCRATCHPAD, onednn::scratchpad(scratch)}});
  };
  dnnl::memory src = onednn::wrap(x_md, x);
  if (e->reorder_src) {
    dnnl::memory blocked(e->pd.src_desc(), onednn::engine());
    reorder(e->src_reorder, e->src_reorder_scratch, src, blocked);
    src = blocked;
  }
  dnnl::memory wts = e->pack_weights ? onednn::packed_weights(w, w_md, e->pd.weights_desc())
                                     : onednn::wrap(w_md, w);
  dnnl::memory user_dst = onednn::wrap(d_md, out);
  dnnl::memory dst = e->reorder_dst ? dnnl::memory(e->pd.dst_desc(), onednn::engine()) : user_dst;
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}};
  if (bias.defined()) args[DNNL_ARG_BIAS] = onednn::wrap(b_md, bias);
  args[DNNL_ARG_SCRATCHPAD] = onednn::scratchpad(e->pd.scratchpad_desc());
  e->prim.execute(s, args);
  if (e->reorder_dst) reorder(e->dst_reorder, e->dst_reorder_scratch, dst, user_dst);
  s.wait();
}

}  // namespace

void Conv2d::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  run_conv(p_, in[0], in[1], has_bias_ ? in[2] : Tensor(), out[0]);
}

}  // namespace tessera
