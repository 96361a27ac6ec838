// CPU evaluation of a FusedKernel: per block of rows, row-wise ops (norms) run into a small
// scratch, then each chunk evaluates the program in fp32 registers-in-buffers and stores only
// the kernel's outputs. Values round to their op's dtype where the op would store. Narrow rows
// (d < kEwChunk) are evaluated several rows per chunk, so the program's per-instruction cost is
// paid per 2048 elements, not per row.
#include <algorithm>
#include <cstring>
#include <memory>

#include "backends/cpu/elementwise/elementwise_kernels.h"
#include "ops/norm.h"
#include "runtime/fusion.h"
#include "runtime/parallel.h"

namespace tessera {
namespace {

// Per-thread float scratch that only grows (no zero-fill, no allocation per call).
float* thread_scratch(size_t n) {
  thread_local std::unique_ptr<float[]> buf;
  thread_local size_t cap = 0;
  if (n > cap) {
    buf.reset(new float[n]);
    cap = n;
  }
  return buf.get();
}

}  // namespace

namespace {

struct DirectRows {
  const LayerNorm* ln = nullptr;
  const RmsNorm* rms = nullptr;
  int x = -1, w = -1, b = -1;  // kernel inputs
};

// What a fused kernel needs to know about its operand views (shapes, strides, dtypes), apart
// from where their data is: computed per call by eval_cpu, once by a prepared kernel.
struct FusedLayout {
  Shape shape;
  int64_t nd = 0, total = 0, d = 1, rows = 0;
  int64_t rpc = 1, block = 1, nblocks = 0;  // rows per chunk, rows per block, blocks
  size_t nin = 0, nval = 0, per_thread = 0;
  std::vector<char> used, same_rows, run_rows;
  // Per value: round it to its dtype in the chunk. Not needed for a value only stored, in that
  // dtype, as an output: the store rounds it the same way.
  std::vector<char> round;
  std::vector<Strides> st;  // operand strides aligned to the output shape (0 where broadcast)
  std::vector<DType> dts;
  std::vector<size_t> ess;
  // Per value: a row-wise norm computed straight into its chunk buffer (f32 rows of at most a
  // chunk) instead of through eval_cpu into scratch per block.
  std::vector<DirectRows> direct;
  // The output written in place of its chunk buffer (f32, the program's last value, which no
  // later instruction reads), or -1.
  int direct_out = -1;
};

// A row-wise instruction whose norm runs on raw f32 rows: x (contiguous, the kernel's shape),
// weight and bias f32 vectors or absent. Anything else goes through eval_cpu.
DirectRows direct_rows_of(const FusedInstr& I, const std::vector<Tensor>& in, int64_t d) {
  DirectRows r;
  if (I.kind != FusedInstr::rowwise || I.dtype != DType::f32 || d > kEwChunk) return r;
  const auto* ln = dynamic_cast<const LayerNorm*>(I.row_prim.get());
  const auto* rms = dynamic_cast<const RmsNorm*>(I.row_prim.get());
  if (!ln && !rms) return r;
  const Tensor& x = in[size_t(I.row_inputs[0])];
  if (x.dtype() != DType::f32 || !x.is_contiguous()) return r;
  int next = 1, w = -1, b = -1;
  if (ln ? ln->has_weight() : rms->has_weight()) w = I.row_inputs[size_t(next++)];
  if (ln && ln->has_bias()) b = I.row_inputs[size_t(next++)];
  for (int p : {w, b}) {
    if (p < 0) continue;
    const Tensor& t = in[size_t(p)];
    if (t.dtype() != DType::f32 || t.ndim() != 1 || !t.is_contiguous() || t.shape()[0] != d)
      return r;
  }
  r.ln = ln;
  r.rms = rms;
  r.x = I.row_inputs[0];
  r.w = w;
  r.b = b;
  return r;
}

FusedLayout layout_of(const std::vector<FusedInstr>& prog, const std::vector<int>& out_values,
                      const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
  FusedLayout L;
  L.round.assign(prog.size(), 1);
  for (size_t q = 0; q < out_values.size(); ++q) {
    const int v = out_values[q];
    bool read_later = false;
    for (size_t w = size_t(v) + 1; w < prog.size(); ++w) {
      const FusedInstr& I = prog[w];
      read_later = read_later || (!I.a.is_input && I.a.index == v) ||
                   (I.kind == FusedInstr::binary && !I.b.is_input && I.b.index == v);
    }
    if (!read_later && out[q].dtype() == prog[size_t(v)].dtype) L.round[size_t(v)] = 0;
  }
  L.shape = out[0].shape();
  const Shape& shape = L.shape;
  const int64_t nd = L.nd = int64_t(shape.size());
  L.total = shape_numel(shape);
  const int64_t d = L.d = nd ? shape.back() : 1;
  L.rows = d ? L.total / d : 0;
  const size_t nin = L.nin = in.size();
  L.nval = prog.size();
  L.used.assign(nin, 0);
  for (const auto& i : prog) {
    if (i.kind == FusedInstr::rowwise) continue;
    if (i.a.is_input) L.used[i.a.index] = 1;
    if (i.kind == FusedInstr::binary && i.b.is_input) L.used[i.b.index] = 1;
  }
  L.st.assign(nin, Strides(size_t(nd), 0));
  L.dts.assign(nin, DType::f32);
  L.ess.assign(nin, 4);
  for (size_t k = 0; k < nin; ++k) {
    if (!L.used[k]) continue;
    const Tensor& t = in[k];
    const int64_t lead = nd - t.ndim();
    for (int64_t j = 0; j < nd; ++j) {
      const int64_t tj = j - lead;
      L.st[k][j] = (tj < 0 || t.shape()[tj] == 1) ? 0 : t.strides()[tj];
    }
    L.dts[k] = t.dtype();
    L.ess[k] = dtype_size(t.dtype());
  }
  // Per operand: every row reads the same elements (a broadcast row vector: fill its buffer once
  // per call), or rows are contiguous one after another (load a chunk's rows as one run).
  L.same_rows.assign(nin, 0);
  L.run_rows.assign(nin, 0);
  for (size_t k = 0; k < nin; ++k) {
    if (!L.used[k] || nd == 0) continue;
    bool same = true, run = L.st[k][nd - 1] == 1;
    int64_t inner_rows = d;
    for (int64_t j = nd - 2; j >= 0; --j) {
      if (shape[j] > 1) {
        same = same && L.st[k][j] == 0;
        run = run && L.st[k][j] == inner_rows;
      }
      inner_rows *= shape[j];
    }
    L.same_rows[k] = same;
    L.run_rows[k] = run;
  }
  // Rows per chunk: whole rows while they fit in one chunk, else one row in column chunks.
  L.rpc = d < kEwChunk ? kEwChunk / d : 1;
  L.block = std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1));
  L.nblocks = (L.rows + L.block - 1) / L.block;
  L.per_thread = (L.nval + nin) * size_t(kEwChunk);
  L.direct.resize(prog.size());
  for (size_t v = 0; v < prog.size(); ++v) L.direct[v] = direct_rows_of(prog[v], in, d);
  for (size_t q = 0; q < out_values.size(); ++q)
    if (size_t(out_values[q]) + 1 == prog.size() && out[q].dtype() == DType::f32 &&
        prog.back().dtype == DType::f32 && out[q].is_contiguous())
      L.direct_out = int(q);
  return L;
}

// Per-thread bookkeeping of run_fused, kept between calls so a run allocates nothing.
struct FusedThreadState {
  std::vector<std::vector<char>> scratch;
  std::vector<int64_t> roff, ls, filled;
  std::vector<const float*> lp;
  std::vector<char> loaded;
};

void run_fused(const std::vector<FusedInstr>& prog, const std::vector<int>& out_values,
               const FusedLayout& L, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  if (L.total == 0) return;
  const Shape& shape = L.shape;
  const int64_t nd = L.nd, d = L.d, rows = L.rows;
  const size_t nin = L.nin, nval = L.nval;
  const auto& st = L.st;
  const auto& dts = L.dts;
  const auto& ess = L.ess;
  const auto& used = L.used;
  const auto& same_rows = L.same_rows;
  const auto& run_rows = L.run_rows;
  std::vector<const char*> base(nin, nullptr);
  for (size_t k = 0; k < nin; ++k)
    if (used[k]) base[k] = static_cast<const char*>(in[k].raw_data());
  std::vector<char*> obase(out.size());
  for (size_t q = 0; q < out.size(); ++q) obase[q] = static_cast<char*>(out[q].raw_data());
  auto f32_input = [&](int k) {
    return k < 0 ? nullptr : static_cast<const float*>(in[size_t(k)].raw_data());
  };
  std::vector<const float*> dx(nval), dw(nval), db(nval);  // direct rows' operands
  for (size_t v = 0; v < nval; ++v) {
    dx[v] = f32_input(L.direct[v].x);
    dw[v] = f32_input(L.direct[v].w);
    db[v] = f32_input(L.direct[v].b);
  }
  const int dq = L.direct_out;
  float* const direct_out = dq < 0 ? nullptr : reinterpret_cast<float*>(obase[size_t(dq)]);

  const EwKernels& K = ew_kernels();
  const int64_t rpc = L.rpc, block = L.block;
  parallel_for(L.nblocks, 1, [&](int64_t b0, int64_t b1) {
    float* vals = thread_scratch(L.per_thread);
    float* bufs = vals + nval * kEwChunk;
    thread_local FusedThreadState ts;
    if (ts.scratch.size() < nval) ts.scratch.resize(nval);
    auto& scratch = ts.scratch;
    auto& roff = ts.roff;
    auto& lp = ts.lp;
    auto& ls = ts.ls;
    auto& loaded = ts.loaded;
    auto& filled = ts.filled;  // same-row operands: the chunk start c0 buffered
    roff.assign(nin, 0);
    lp.assign(nin, nullptr);
    ls.assign(nin, 0);
    loaded.assign(nin, 0);
    filled.assign(nin, -1);
    // Offset (elements) of row r of input k.
    auto row_offset = [&](size_t k, int64_t r) {
      int64_t off = 0, rem = r;
      for (int64_t j = nd - 2; j >= 0; --j) {
        off += (rem % shape[j]) * st[k][j];
        rem /= shape[j];
      }
      return off;
    };
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * block, r1 = std::min(rows, r0 + block);
      for (size_t v = 0; v < nval; ++v) {
        const FusedInstr& I = prog[v];
        if (I.kind != FusedInstr::rowwise || dx[v]) continue;
        scratch[v].resize(size_t((r1 - r0) * d) * dtype_size(I.dtype));
        std::vector<Tensor> rin;
        for (size_t j = 0; j < I.row_inputs.size(); ++j) {
          const Tensor& t = in[I.row_inputs[j]];
          rin.push_back(j == 0 ? t.view({rows, d}).slice(0, r0, r1) : t);
        }
        std::vector<Tensor> rout{
            Tensor::from_blob(scratch[v].data(), {r1 - r0, d}, I.dtype, nullptr)};
        I.row_prim->eval_cpu(rin, rout);
      }
      for (int64_t r = r0; r < r1; r += rpc) {
        const int64_t nr = std::min(rpc, r1 - r);  // rows in this chunk (1 when d >= chunk)
        for (size_t k = 0; k < nin; ++k)
          if (used[k]) roff[k] = row_offset(k, r);
        for (int64_t c0 = 0; c0 < d; c0 += kEwChunk) {
          const int64_t n = nr > 1 ? nr * d : std::min(kEwChunk, d - c0);
          std::fill(loaded.begin(), loaded.end(), 0);
          // Value v's buffer for this chunk: its slot in vals, or the output it is stored as.
          auto value = [&](size_t v) {
            return direct_out && v + 1 == nval ? direct_out + r * d + c0 : vals + v * kEwChunk;
          };
          auto fetch = [&](const FusedOperand& o, const float** p, int64_t* s) {
            if (!o.is_input) {
              *p = value(size_t(o.index));
              *s = 1;
              return;
            }
            const int k = o.index;
            if (!loaded[k]) {
              const DType dt = dts[k];
              const int64_t es = int64_t(ess[k]);
              const int64_t inner = nd ? st[k][nd - 1] : 0;
              float* buf = bufs + size_t(k) * kEwChunk;
              const int64_t m = nr > 1 ? d : n;  // elements per row segment
              // Rows of this chunk: one contiguous run, all the same, or gathered row by row.
              bool same = true, run = inner == 1;
              if (nr > 1 && same_rows[k]) {
                run = false;
                if (inner == 1 && nr == rpc && filled[k] == c0) {
                  *p = lp[k] = buf;  // the same rows as the last full chunk: still buffered
                  *s = ls[k] = 1;
                  loaded[k] = 1;
                  return;
                }
              } else if (nr > 1 && run_rows[k]) {
                same = false;
              } else {
                for (int64_t i = 1; i < nr && (same || run); ++i) {
                  const int64_t off = row_offset(k, r + i);
                  same = same && off == roff[k];
                  run = run && off == roff[k] + i * d;
                }
              }
              filled[k] = -1;
              const char* src = base[k] + (roff[k] + c0 * inner) * es;
              if (inner == 0 && same) {
                lp[k] = ew_load(src, dt, 1, buf);
                ls[k] = 0;
              } else if (run || (inner == 1 && nr == 1)) {
                lp[k] = ew_load(src, dt, n, buf);
                ls[k] = 1;
              } else {
                // A broadcast row is every row's: loaded once, then the buffer doubled.
                const bool one_row = nr > 1 && same_rows[k];
                const int64_t gathered = one_row && inner == 1 ? 1 : nr;
                for (int64_t i = 0; i < gathered; ++i) {
                  const int64_t off = i ? row_offset(k, r + i) : roff[k];
                  const char* rs = base[k] + off * es + c0 * inner * es;
                  float* rb = buf + i * m;
                  if (inner == 1) {
                    const float* f = ew_load(rs, dt, m, rb);
                    if (f != rb) std::memcpy(rb, f, size_t(m) * 4);
                  } else if (inner == 0) {
                    float v;
                    convert_elements(rs, dt, &v, DType::f32, 1);
                    std::fill(rb, rb + m, v);
                  } else {
                    for (int64_t e = 0; e < m; ++e)
                      convert_elements(rs + e * inner * es, dt, rb + e, DType::f32, 1);
                  }
                }
                for (int64_t have = m; gathered == 1 && have < nr * m; have *= 2)
                  std::memcpy(buf + have, buf, size_t(std::min(have, nr * m - have)) * 4);
                lp[k] = buf;
                ls[k] = 1;
                if (same && inner == 1 && nr == rpc && nr > 1) filled[k] = c0;
              }
              loaded[k] = 1;
            }
            *p = lp[k];
            *s = ls[k];
          };
          for (size_t v = 0; v < nval; ++v) {
            const FusedInstr& I = prog[v];
            float* o = value(v);
            const float *pa = nullptr, *pb = nullptr;
            int64_t sa = 0, sb = 0;
            switch (I.kind) {
              case FusedInstr::binary:
                fetch(I.a, &pa, &sa);
                fetch(I.b, &pb, &sb);
                K.binary(I.bop, pa, sa, pb, sb, o, n);
                break;
              case FusedInstr::binary_scalar:
                fetch(I.a, &pa, &sa);
                if (I.scalar_first)
                  K.binary(I.bop, &I.scalar, 0, pa, sa, o, n);
                else
                  K.binary(I.bop, pa, sa, &I.scalar, 0, o, n);
                break;
              case FusedInstr::unary:
                fetch(I.a, &pa, &sa);
                if (sa == 0) {
                  std::fill(o, o + n, pa[0]);
                  pa = o;
                }
                K.unary(I.uop, pa, o, n, I.dtype == DType::bf16);
                break;
              case FusedInstr::convert:  // the rounding below is the conversion
                fetch(I.a, &pa, &sa);
                if (sa == 0)
                  std::fill(o, o + n, pa[0]);
                else
                  std::memcpy(o, pa, size_t(n) * 4);
                break;
              case FusedInstr::rowwise: {
                const DirectRows& dr = L.direct[v];
                if (dr.ln) {  // whole rows (d <= kEwChunk): this chunk's nr rows
                  dr.ln->f32_rows(dx[v] + r * d, nr, d, dw[v], db[v], o);
                  break;
                }
                if (dr.rms) {
                  dr.rms->f32_rows(dx[v] + r * d, nr, d, dw[v], o);
                  break;
                }
                const char* src =
                    scratch[v].data() + ((r - r0) * d + c0) * int64_t(dtype_size(I.dtype));
                const float* f = ew_load(src, I.dtype, n, o);
                if (f != o) std::memcpy(o, f, size_t(n) * 4);
                break;
              }
            }
            if (L.round[v]) ew_round_through(o, I.dtype, n);
          }
          for (size_t q = 0; q < out.size(); ++q) {
            if (int(q) == dq) continue;  // written in place
            const size_t es = dtype_size(out[q].dtype());
            ew_store(value(size_t(out_values[q])), obase[q] + (r * d + c0) * int64_t(es),
                     out[q].dtype(), n);
          }
        }
      }
    }
  });
}

class PreparedFused final : public PreparedKernel {
 public:
  PreparedFused(const FusedKernel& k, FusedLayout layout) : k_(k), layout_(std::move(layout)) {}
  void run(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    run_fused(k_.program(), k_.out_values(), layout_, in, out);
  }

 private:
  const FusedKernel& k_;  // owned by the plan step that owns this kernel
  FusedLayout layout_;
};

}  // namespace

void FusedKernel::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  run_fused(prog_, out_values_, layout_of(prog_, out_values_, in, out), in, out);
}

// The layout depends only on the views, so a program or replayed segment computes it once; the
// arithmetic is run_fused's either way, so the bits are eval_cpu's.
std::unique_ptr<PreparedKernel> FusedKernel::prepare_cpu(const std::vector<Tensor>& in,
                                                         const std::vector<Tensor>& out) {
  return std::make_unique<PreparedFused>(*this, layout_of(prog_, out_values_, in, out));
}

}  // namespace tessera
