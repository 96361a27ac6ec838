#include "nn/input_checks.h"

#include <sstream>

#include "runtime/error.h"

namespace tessera::nn {

void check_input_shape(const char* where, const char* input, const Tensor& t,
                       const std::vector<Dim>& dims) {
  bool ok = t.defined() && t.ndim() == int64_t(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i)
    ok = dims[i].size < 0 || t.dim(int64_t(i)) == dims[i].size;
  if (ok) return;
  std::ostringstream want;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) want << ", ";
    if (dims[i].size >= 0) want << dims[i].size;
    else want << dims[i].name;
  }
  if (dims.size() == 1) want << ",";
  TESSERA_FAIL(where, " ", input, " must be (", want.str(), "), got ",
               t.defined() ? t.describe() : "nothing");
}

}  // namespace tessera::nn
