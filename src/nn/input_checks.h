// The shape checks at the top of every model's forward, written once: an input's rank and the
// sizes that must match, with an error that names the model, the input and the shape expected.
#pragma once
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessera::nn {

// One expected dimension: a fixed size, or any size shown by its name ("L_img").
struct Dim {
  Dim(int64_t size) : size(size) {}  // NOLINT: sizes read best as plain numbers in a list
  Dim(const char* name) : size(-1), name(name) {}  // NOLINT
  int64_t size;
  const char* name = "";
};

// Fails with "<where> <input> must be (1, L_txt, 96), got <t>" unless t has these dimensions.
void check_input_shape(const char* where, const char* input, const Tensor& t,
                       const std::vector<Dim>& dims);

}  // namespace tessera::nn
