// Compiled mode's tracer: the traced function runs on placeholder tensors while dispatch()
// records each op into the trace (runtime/graph_plan.h's tracing() / trace_record()).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/graph_plan.h"

namespace tessera::graph_detail {

// A host read of a traced tensor: fullgraph=false turns it into an eager fallback.
class GraphBreak : public Error {
 public:
  using Error::Error;
};

// Runs fn on placeholders for `inputs` (pending tensors of the trace; undefined inputs stay
// undefined), recording its ops into *nodes; returns fn's outputs. Throws GraphBreak.
std::vector<Tensor> trace_function(
    const std::string& where, const std::vector<Tensor>& inputs,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    std::vector<Node>* nodes);

}  // namespace tessera::graph_detail
