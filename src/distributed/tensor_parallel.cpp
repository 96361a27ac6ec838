#include "distributed/tensor_parallel.h"

#include "ops/copy.h"
#include "ops/shape_ops.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace tessera {

TensorParallelConfig TensorParallelConfig::over_world(int expected, const char* where) {
  auto world = init_process_group("mpi");
  TESSERA_CHECK(world->size() == expected, where, " --tp ", expected, " needs ", expected,
                " ranks, but this run has ", world->size(),
                " (start it with tessera launch --nproc-per-node ", expected, ")");
  TensorParallelConfig c;
  c.mesh = init_device_mesh(DeviceType::cpu, *world);
  c.group = world;
  return c;
}

TensorParallelConfig TensorParallelConfig::over_devices(const Device& first, int n,
                                                        const char* where) {
  TESSERA_CHECK(n >= 1, where, " --tp ", n, ": the degree must be at least 1");
  TESSERA_CHECK(first.type == DeviceType::xla || first.type == DeviceType::tpu, where, " --tp ", n,
                " on ", first.str(), ": one process drives several devices only on XLA devices "
                "(xla:cpu, xla:cuda, tpu); on CPU ranks start one process per rank with tessera "
                "launch --nproc-per-node ", n);
  backend_for(first).prepare_sharding(first, n, where);
  TensorParallelConfig c;
  std::vector<int> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(first.index + i);
  c.mesh = DeviceMesh(first.type, ranks);
  c.spmd_device = first;
  return c;
}

const char* parallel_style_name(ParallelStyle style) {
  switch (style) {
    case ParallelStyle::colwise:
      return "colwise";
    case ParallelStyle::rowwise:
      return "rowwise";
    default:
      return "replicate";
  }
}

Tensor read_shard(const Tensor& full, const ShardSpec& spec) {
  if (!spec.sharded()) return full;
  std::vector<Tensor> pieces;
  for (const auto& [b, e] : spec.ranges(full.dim(spec.dim)))
    pieces.push_back(full.slice(spec.dim, b, e));
  // One piece of rows stays a zero-copy view (its pages are read when used); anything else is
  // copied now, reading only the slice's bytes.
  if (pieces.size() == 1) return contiguous(pieces[0]);
  return concat(pieces, spec.dim);
}

}  // namespace tessera
