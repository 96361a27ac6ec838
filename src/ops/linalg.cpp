#include "ops/linalg.h"

#include <algorithm>

#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {
namespace {

void check_dtypes(const char* op, const char* na, const Tensor& a, const char* nb,
                  const Tensor& b) {
  TESSERA_CHECK(a.dtype() == b.dtype(), "[", op, "] mixed input dtypes: ", na, " is ", a.describe(),
                " and ", nb, " is ", b.describe(), "; expected the same dtype");
  TESSERA_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::bf16, "[", op, "] ", na, " is ",
                a.describe(), "; expected dtype f32 or bf16");
}

// The kernel reads any view whose matrix (last two dims) has a unit stride on one side and that
// has no broadcast (stride-0) dims; anything else is copied first.
Tensor gemm_operand(const Tensor& t) {
  const int64_t nd = t.ndim();
  bool ok = t.strides()[size_t(nd - 1)] == 1 || t.dim(-1) == 1 ||
            t.strides()[size_t(nd - 2)] == 1 || t.dim(-2) == 1;
  for (int64_t i = 0; i < nd; ++i)
    if (t.shape()[size_t(i)] > 1 && t.strides()[size_t(i)] == 0) ok = false;
  return ok ? t : contiguous(t);
}

// `t` viewed as [rows, t.dim(-1)], copying only when the view is impossible.
Tensor as_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < t.ndim(); ++i) rows *= t.shape()[size_t(i)];
  const Shape s{rows, t.dim(-1)};
  try {
    return t.view(s);
  } catch (const Error&) {
    return contiguous(t).view(s);
  }
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  TESSERA_CHECK(a_in.defined() && b_in.defined(), "[matmul] got an undefined input");
  TESSERA_CHECK(a_in.ndim() >= 1 && b_in.ndim() >= 1, "[matmul] inputs must have at least one ",
                "dimension, got ", a_in.describe(), " and ", b_in.describe());
  check_dtypes("matmul", "a", a_in, "b", b_in);
  const bool a_vec = a_in.ndim() == 1, b_vec = b_in.ndim() == 1;
  Tensor a = a_vec ? a_in.unsqueeze(0) : a_in;
  Tensor b = b_vec ? b_in.unsqueeze(1) : b_in;
  const int64_t M = a.dim(-2), K = a.dim(-1), N = b.dim(-1);
  TESSERA_CHECK(b.dim(-2) == K, "[matmul] shapes ", shape_str(a_in.shape()), " and ",
                shape_str(b_in.shape()), " cannot be multiplied: a has ", K, " columns but b has ",
                b.dim(-2), " rows; expected equal");
  // Batch shape: numpy broadcasting of everything but the matrix dims.
  const int64_t nb = std::max(a.ndim(), b.ndim()) - 2;
  Shape batch(size_t(nb), 1);
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t da = i - (nb - (a.ndim() - 2)), db = i - (nb - (b.ndim() - 2));
    const int64_t sa = da >= 0 ? a.shape()[size_t(da)] : 1;
    const int64_t sb = db >= 0 ? b.shape()[size_t(db)] : 1;
    TESSERA_CHECK(sa == sb || sa == 1 || sb == 1, "[matmul] batch dimensions of ",
                  shape_str(a_in.shape()), " and ", shape_str(b_in.shape()),
                  " do not broadcast: ", sa, " vs ", sb, " at batch dim ", i);
    batch[size_t(i)] = std::max(sa, sb);
  }
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out;
  if (b.ndim() == 2 && a.ndim() > 2) {
    // A shared right operand: fold a's batch into its rows, one 2-D GEMM.
    Tensor a2 = gemm_operand(as_rows(a));
    out = dispatch1(std::make_shared<Matmul>(), {a2, gemm_operand(b)}, {{a2.dim(0), N}, a.dtype()})
              .view(out_shape);
  } else {
    while (a.ndim() < nb + 2) a = a.unsqueeze(0);
    while (b.ndim() < nb + 2) b = b.unsqueeze(0);
    out = dispatch1(std::make_shared<Matmul>(), {gemm_operand(a), gemm_operand(b)},
                    {out_shape, a.dtype()});
  }
  if (a_vec) out = out.squeeze(-2);
  if (b_vec) out = out.squeeze(-1);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSERA_CHECK(x.defined() && weight.defined(), "[linear] got an undefined input or weight");
  TESSERA_CHECK(weight.ndim() == 2, "[linear] weight must be 2-D [out_features, in_features], got ",
                weight.describe());
  TESSERA_CHECK(x.ndim() >= 1, "[linear] input must have at least one dimension, got ",
                x.describe());
  check_dtypes("linear", "input", x, "weight", weight);
  const int64_t N = weight.dim(0), K = weight.dim(1);
  TESSERA_CHECK(x.dim(-1) == K, "[linear] input ", x.describe(), " has ", x.dim(-1),
                " features but weight ", weight.describe(), " expects ", K,
                " (weight is [out_features, in_features])");
  std::vector<Tensor> inputs{gemm_operand(as_rows(x)), gemm_operand(weight)};
  if (bias.defined()) {
    check_dtypes("linear", "input", x, "bias", bias);
    TESSERA_CHECK(bias.ndim() == 1 && bias.dim(0) == N, "[linear] bias ", bias.describe(),
                  " does not match weight ", weight.describe(), "; expected shape ",
                  shape_str({N}));
    inputs.push_back(contiguous(bias));
  }
  Shape out_shape = x.shape();
  out_shape.back() = N;
  return dispatch1(std::make_shared<Linear>(bias.defined()), inputs,
                   {{inputs[0].dim(0), N}, x.dtype()})
      .view(out_shape);
}

}  // namespace tessera
