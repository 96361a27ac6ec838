// Collectives as tensor ops: each is a primitive dispatched like any other op, so strict eager
// runs it on the stream, deferred mode records it into a segment and compiled mode into the
// program (an opaque step that is never fused). Every rank must issue the same collectives in
// the same order, which running the same program gives.
#pragma once
#include <memory>

#include "distributed/process_group.h"
#include "runtime/primitive.h"

namespace tessera {

// Elementwise sum of `x` over the group's ranks (torch.distributed.all_reduce, SUM).
Tensor all_reduce(const Tensor& x, const std::shared_ptr<ProcessGroup>& group);
// Every rank's `x` concatenated along `dim` in rank order (all_gather_into_tensor + cat).
Tensor all_gather(const Tensor& x, int64_t dim, const std::shared_ptr<ProcessGroup>& group);

}  // namespace tessera
