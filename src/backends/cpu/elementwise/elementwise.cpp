// CPU drivers for the elementwise primitives: broadcast rows, dtype conversion in chunks, and
// the per-ISA row kernels of elementwise_loops.h.
#include <algorithm>
#include <cstring>

#include "backends/cpu/elementwise/elementwise_kernels.h"
#include "ops/copy.h"
#include "runtime/error.h"
#include "runtime/parallel.h"

namespace tessera {

const EwKernels& ew_kernels_for(CpuIsa isa) {
  if (isa >= CpuIsa::avx512) return ew_kernels_avx512();
  if (isa == CpuIsa::avx2) return ew_kernels_avx2();
  return ew_kernels_scalar();
}

const EwKernels& ew_kernels() {
  static const EwKernels& k = ew_kernels_for(cpu_isa());
  return k;
}

const float* ew_load(const void* p, DType t, int64_t n, float* buf) {
  if (t == DType::f32) return static_cast<const float*>(p);
  if (t == DType::bf16)
    ew_kernels().bf16_to_f32(static_cast<const uint16_t*>(p), buf, n);
  else
    convert_elements(p, t, buf, DType::f32, size_t(n));
  return buf;
}

void ew_store(const float* x, void* dst, DType t, int64_t n) {
  if (t == DType::f32) {
    if (x != dst) std::memcpy(dst, x, size_t(n) * 4);
  } else if (t == DType::bf16) {
    ew_kernels().f32_to_bf16(x, static_cast<uint16_t*>(dst), n);
  } else {
    convert_elements(x, DType::f32, dst, t, size_t(n));
  }
}

// Rounds floats to dtype t and back: where a torch expression stores an intermediate.
void ew_round_through(float* x, DType t, int64_t n) {
  if (t == DType::f32) return;
  if (t == DType::bf16) {
    ew_kernels().round_bf16(x, n);
  } else {
    uint16_t tmp[kEwChunk];
    convert_elements(x, DType::f32, tmp, t, size_t(n));
    convert_elements(tmp, t, x, DType::f32, size_t(n));
  }
}

namespace {

bool is_int(DType t) {
  return t == DType::i64 || t == DType::i32;
}

// Output rows of a broadcast: the coalesced outer dims and, per operand, their strides and the
// stride along the inner (last) dim, which is 0 or 1 for contiguous operands.
struct Rows {
  Shape outer;
  std::vector<Strides> strides;
  std::vector<int64_t> inner_stride;
  int64_t inner = 1, rows = 1;
  int64_t offset(size_t k, int64_t r) const {
    int64_t off = 0;
    for (int64_t d = int64_t(outer.size()) - 1; d >= 0; --d) {
      off += (r % outer[d]) * strides[k][d];
      r /= outer[d];
    }
    return off;
  }
};

Rows make_rows(const Shape& out, const std::vector<Tensor>& ops) {
  const size_t nd = out.size(), nk = ops.size();
  Shape shape;
  std::vector<Strides> st(nk);
  for (size_t d = 0; d < nd; ++d) {
    if (out[d] == 1) continue;
    bool merge = !shape.empty();
    std::vector<int64_t> s(nk);
    for (size_t k = 0; k < nk; ++k) {
      const Tensor& t = ops[k];
      const int64_t lead = int64_t(nd) - t.ndim();
      const int64_t td = int64_t(d) - lead;
      s[k] = (td < 0 || t.shape()[td] == 1) ? 0 : t.strides()[td];
      if (merge && st[k].back() != s[k] * out[d]) merge = false;
    }
    if (merge) {
      shape.back() *= out[d];
      for (size_t k = 0; k < nk; ++k) st[k].back() = s[k];
    } else {
      shape.push_back(out[d]);
      for (size_t k = 0; k < nk; ++k) st[k].push_back(s[k]);
    }
  }
  Rows r;
  r.strides.resize(nk);
  r.inner_stride.assign(nk, 0);
  if (shape.empty()) return r;
  r.inner = shape.back();
  for (size_t k = 0; k < nk; ++k) {
    r.inner_stride[k] = st[k].back();
    TESSERA_CHECK(r.inner_stride[k] == 0 || r.inner_stride[k] == 1,
                  "[elementwise] internal: inner stride ", r.inner_stride[k]);
    r.strides[k].assign(st[k].begin(), st[k].end() - 1);
  }
  r.outer.assign(shape.begin(), shape.end() - 1);
  r.rows = shape_numel(r.outer);
  return r;
}

// Runs f(row, c0, c1) over every row split in chunks of kEwChunk, in parallel.
template <typename F>
void for_each_chunk(int64_t rows, int64_t inner, F&& f) {
  if (rows <= 0 || inner <= 0) return;
  const int64_t nch = (inner + kEwChunk - 1) / kEwChunk;
  const int64_t per = std::min(inner, kEwChunk);
  const int64_t grain = std::max<int64_t>(1, 32768 / per);
  parallel_for(rows * nch, grain, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      const int64_t r = w / nch, c0 = (w % nch) * kEwChunk;
      f(r, c0, std::min(inner, c0 + kEwChunk));
    }
  });
}

const char* at(const Tensor& t, int64_t elem) {
  return static_cast<const char*>(t.raw_data()) + elem * int64_t(dtype_size(t.dtype()));
}
char* at_mut(const Tensor& t, int64_t elem) {
  return static_cast<char*>(t.raw_data()) + elem * int64_t(dtype_size(t.dtype()));
}

int64_t int_op(BinaryOp op, int64_t x, int64_t y) {
  switch (op) {
    case BinaryOp::add:
      return x + y;
    case BinaryOp::sub:
      return x - y;
    case BinaryOp::mul:
      return x * y;
    case BinaryOp::maximum:
      return std::max(x, y);
    case BinaryOp::minimum:
      return std::min(x, y);
    default:
      TESSERA_FAIL("[", binary_op_name(op), "] not supported on integer tensors");
  }
}

// a (or the scalar when a is undefined) op b (or the scalar), written to o. Inputs contiguous.
void run_binary(BinaryOp op, const Tensor& a, const Tensor& b, double scalar, Tensor& o) {
  std::vector<Tensor> ops{o};
  if (a.defined()) ops.push_back(a);
  if (b.defined()) ops.push_back(b);
  const Rows R = make_rows(o.shape(), ops);
  const size_t ka = a.defined() ? 1 : 0, kb = a.defined() ? 2 : 1;
  const int64_t sa = a.defined() ? R.inner_stride[ka] : 0;
  const int64_t sb = b.defined() ? R.inner_stride[kb] : 0;
  if (is_int(o.dtype())) {
    const int64_t si = int64_t(scalar);
    for_each_chunk(R.rows, R.inner, [&](int64_t r, int64_t c0, int64_t c1) {
      const int64_t n = c1 - c0;
      int64_t xa[kEwChunk], xb[kEwChunk], xo[kEwChunk];
      if (a.defined())
        convert_elements(at(a, R.offset(ka, r) + c0 * sa), a.dtype(), xa, DType::i64,
                         size_t(sa ? n : 1));
      else
        xa[0] = si;
      if (b.defined())
        convert_elements(at(b, R.offset(kb, r) + c0 * sb), b.dtype(), xb, DType::i64,
                         size_t(sb ? n : 1));
      else
        xb[0] = si;
      for (int64_t i = 0; i < n; ++i) xo[i] = int_op(op, xa[i * sa], xb[i * sb]);
      convert_elements(xo, DType::i64, at_mut(o, R.offset(0, r) + c0), o.dtype(), size_t(n));
    });
    return;
  }
  const EwKernels& k = ew_kernels();
  if (a.defined() && b.defined() && a.dtype() == DType::bf16 && b.dtype() == DType::bf16 &&
      o.dtype() == DType::bf16) {
    for_each_chunk(R.rows, R.inner, [&](int64_t r, int64_t c0, int64_t c1) {
      k.binary_bf16(op, a.data<uint16_t>() + R.offset(ka, r) + c0 * sa, sa,
                    b.data<uint16_t>() + R.offset(kb, r) + c0 * sb, sb,
                    o.data<uint16_t>() + R.offset(0, r) + c0, c1 - c0);
    });
    return;
  }
  const float s = float(scalar);
  for_each_chunk(R.rows, R.inner, [&](int64_t r, int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    float ba[kEwChunk], bb[kEwChunk], bo[kEwChunk];
    const float* fa =
        a.defined() ? ew_load(at(a, R.offset(ka, r) + c0 * sa), a.dtype(), sa ? n : 1, ba) : &s;
    const float* fb =
        b.defined() ? ew_load(at(b, R.offset(kb, r) + c0 * sb), b.dtype(), sb ? n : 1, bb) : &s;
    char* po = at_mut(o, R.offset(0, r) + c0);
    float* fo = o.dtype() == DType::f32 ? reinterpret_cast<float*>(po) : bo;
    k.binary(op, fa, sa, fb, sb, fo, n);
    if (o.dtype() != DType::f32) ew_store(fo, po, o.dtype(), n);
  });
}

int64_t int_unary(UnaryOp op, int64_t x) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::abs:
      return x < 0 ? -x : x;
    case UnaryOp::square:
      return x * x;
    case UnaryOp::relu:
      return x > 0 ? x : 0;
    default:
      TESSERA_FAIL("[", unary_op_name(op), "] not supported on integer tensors");
  }
}

}  // namespace

void Binary::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  run_binary(op_, contiguous(in[0]), contiguous(in[1]), 0.0, out[0]);
}

namespace {

// x ** e for the exponents torch special-cases; false when e is not one of them.
bool pow_special(const Tensor& x, Tensor& o, double e) {
  enum Kind { sq, cube, sqrt_, rsqrt_, recip, recip_sq } kind;
  if (e == 2.0)
    kind = sq;
  else if (e == 3.0)
    kind = cube;
  else if (e == 0.5)
    kind = sqrt_;
  else if (e == -0.5)
    kind = rsqrt_;
  else if (e == -1.0)
    kind = recip;
  else if (e == -2.0)
    kind = recip_sq;
  else
    return false;
  const EwKernels& k = ew_kernels();
  const float one = 1.f;
  for_each_chunk(1, o.numel(), [&](int64_t, int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    float bx[kEwChunk], bo[kEwChunk];
    const float* fx = ew_load(at(x, c0), x.dtype(), n, bx);
    switch (kind) {
      case sq:
        k.binary(BinaryOp::mul, fx, 1, fx, 1, bo, n);
        break;
      case cube:
      case recip_sq:
        k.binary(BinaryOp::mul, fx, 1, fx, 1, bo, n);
        ew_round_through(bo, o.dtype(), n);  // torch multiplies in the tensor's dtype
        if (kind == cube)
          k.binary(BinaryOp::mul, bo, 1, fx, 1, bo, n);
        else
          k.binary(BinaryOp::div, &one, 0, bo, 1, bo, n);
        break;
      case sqrt_:
        k.unary(UnaryOp::sqrt, fx, bo, n, false);
        break;
      case rsqrt_:
        k.unary(UnaryOp::rsqrt, fx, bo, n, false);
        break;
      case recip:
        k.binary(BinaryOp::div, &one, 0, fx, 1, bo, n);
        break;
    }
    ew_store(bo, at_mut(o, c0), o.dtype(), n);
  });
  return true;
}

}  // namespace

namespace {

// f32 a op b on contiguous operands of the output's shape, or a op scalar (scalar op a): the
// table call run_binary makes for these views, on the same chunks, without its per-call layout
// work (FLUX's 1 + scale on (1, 1, 32) spent ~0.5 us there per call).
class PreparedF32Binary final : public PreparedKernel {
 public:
  PreparedF32Binary(BinaryOp op, bool with_scalar, float scalar, bool scalar_first)
      : op_(op), with_scalar_(with_scalar), scalar_(scalar), scalar_first_(scalar_first) {}
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const float* a = in[0].data<float>();
    const float* b = with_scalar_ ? &scalar_ : in[1].data<float>();
    const int64_t sb = with_scalar_ ? 0 : 1;
    float* o = out[0].data<float>();
    const EwKernels& k = ew_kernels();
    for_each_chunk(1, out[0].numel(), [&](int64_t, int64_t c0, int64_t c1) {
      if (scalar_first_)
        k.binary(op_, b, 0, a + c0, 1, o + c0, c1 - c0);
      else
        k.binary(op_, a + c0, 1, b + sb * c0, sb, o + c0, c1 - c0);
    });
  }

 private:
  BinaryOp op_;
  bool with_scalar_;
  float scalar_;
  bool scalar_first_;
};

bool f32_contiguous_like(const Tensor& t, const Tensor& o) {
  return t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == o.shape();
}

}  // namespace

std::unique_ptr<PreparedKernel> Binary::prepare_cpu(const std::vector<Tensor>& in,
                                                    const std::vector<Tensor>& out) {
  const Tensor& o = out[0];
  if (o.dtype() != DType::f32 || !f32_contiguous_like(in[0], o) || !f32_contiguous_like(in[1], o))
    return nullptr;
  return std::make_unique<PreparedF32Binary>(op_, false, 0.f, false);
}

// pow keeps eval_cpu (its special exponents); f32 uses the scalar as float(s), unrounded.
std::unique_ptr<PreparedKernel> BinaryScalar::prepare_cpu(const std::vector<Tensor>& in,
                                                          const std::vector<Tensor>& out) {
  const Tensor& o = out[0];
  if (op_ == BinaryOp::pow || o.dtype() != DType::f32 || !f32_contiguous_like(in[0], o))
    return nullptr;
  return std::make_unique<PreparedF32Binary>(op_, true, float(scalar_), scalar_first_);
}

void BinaryScalar::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  double s = scalar_;
  const bool reduced =
      (o.dtype() == DType::bf16 || o.dtype() == DType::f16) && x.dtype() == o.dtype();
  if (is_floating(o.dtype()) && op_ == BinaryOp::pow && !scalar_first_ && pow_special(x, o, s))
    return;
  // torch rounds a Python scalar to a bf16/f16 tensor's dtype for add, sub and pow.
  if (reduced && (op_ == BinaryOp::add || op_ == BinaryOp::sub || op_ == BinaryOp::pow)) {
    float f = float(s);
    ew_round_through(&f, o.dtype(), 1);
    s = f;
  }
  if (scalar_first_)
    run_binary(op_, Tensor(), x, s, o);
  else
    run_binary(op_, x, Tensor(), s, o);
}

void Unary::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  const int64_t total = o.numel();
  if (is_int(o.dtype())) {
    for_each_chunk(1, total, [&](int64_t, int64_t c0, int64_t c1) {
      int64_t v[kEwChunk];
      const int64_t n = c1 - c0;
      convert_elements(at(x, c0), x.dtype(), v, DType::i64, size_t(n));
      for (int64_t i = 0; i < n; ++i) v[i] = int_unary(op_, v[i]);
      convert_elements(v, DType::i64, at_mut(o, c0), o.dtype(), size_t(n));
    });
    return;
  }
  const EwKernels& k = ew_kernels();
  const bool bf16_steps = o.dtype() == DType::bf16;
  // One pass for the cheap ops; the transcendental ones measured as fast or faster through
  // the fp32 chunk (the conversion is hidden behind their arithmetic).
  const bool cheap =
      op_ == UnaryOp::neg || op_ == UnaryOp::abs || op_ == UnaryOp::square || op_ == UnaryOp::relu;
  if (cheap && x.dtype() == DType::bf16 && o.dtype() == DType::bf16) {
    for_each_chunk(1, total, [&](int64_t, int64_t c0, int64_t c1) {
      k.unary_bf16(op_, x.data<uint16_t>() + c0, o.data<uint16_t>() + c0, c1 - c0, true);
    });
    return;
  }
  for_each_chunk(1, total, [&](int64_t, int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    float bx[kEwChunk], bo[kEwChunk];
    const float* fx = ew_load(at(x, c0), x.dtype(), n, bx);
    char* po = at_mut(o, c0);
    float* fo = o.dtype() == DType::f32 ? reinterpret_cast<float*>(po) : bo;
    k.unary(op_, fx, fo, n, bf16_steps);
    if (o.dtype() != DType::f32) ew_store(fo, po, o.dtype(), n);
  });
}

void Glu::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = contiguous(in[0]);
  Tensor& o = out[0];
  const int64_t h = o.ndim() ? o.shape().back() : 1;
  const int64_t rows = h ? o.numel() / h : 0;
  const EwKernels& k = ew_kernels();
  for_each_chunk(rows, h, [&](int64_t r, int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    float bg[kEwChunk], bv[kEwChunk], bo[kEwChunk];
    const int64_t first = r * 2 * h + c0, second = first + h;
    const float* fg = ew_load(at(x, gate_first_ ? first : second), x.dtype(), n, bg);
    k.unary(act_, fg, bg, n, false);
    ew_round_through(bg, o.dtype(), n);  // torch stores act(gate) before the product
    const float* fv = ew_load(at(x, gate_first_ ? second : first), x.dtype(), n, bv);
    char* po = at_mut(o, r * h + c0);
    float* fo = o.dtype() == DType::f32 ? reinterpret_cast<float*>(po) : bo;
    if (gate_first_)
      k.binary(BinaryOp::mul, bg, 1, fv, 1, fo, n);
    else
      k.binary(BinaryOp::mul, fv, 1, bg, 1, fo, n);
    if (o.dtype() != DType::f32) ew_store(fo, po, o.dtype(), n);
  });
}

void Where::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor c = contiguous(in[0]), a = contiguous(in[1]), b = contiguous(in[2]);
  Tensor& o = out[0];
  const Rows R = make_rows(o.shape(), {o, c, a, b});
  const int64_t sc = R.inner_stride[1], sa = R.inner_stride[2], sb = R.inner_stride[3];
  for_each_chunk(R.rows, R.inner, [&](int64_t r, int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    float bc[kEwChunk], ba[kEwChunk], bb[kEwChunk], bo[kEwChunk];
    const float* fc = ew_load(at(c, R.offset(1, r) + c0 * sc), c.dtype(), sc ? n : 1, bc);
    const float* fa = ew_load(at(a, R.offset(2, r) + c0 * sa), a.dtype(), sa ? n : 1, ba);
    const float* fb = ew_load(at(b, R.offset(3, r) + c0 * sb), b.dtype(), sb ? n : 1, bb);
    for (int64_t i = 0; i < n; ++i) bo[i] = fc[i * sc] != 0.f ? fa[i * sa] : fb[i * sb];
    ew_store(bo, at_mut(o, R.offset(0, r) + c0), o.dtype(), n);
  });
}

}  // namespace tessera
