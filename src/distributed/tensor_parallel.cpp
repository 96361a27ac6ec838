#include "distributed/tensor_parallel.h"

#include "ops/copy.h"
#include "ops/shape_ops.h"
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

std::vector<std::pair<int64_t, int64_t>> ShardSpec::ranges(int64_t full_size) const {
  std::vector<int64_t> blocks = packed.empty() ? std::vector<int64_t>{full_size} : packed;
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t base = 0;
  for (int64_t b : blocks) {
    const int64_t piece = b / parts;
    out.emplace_back(base + index * piece, base + (index + 1) * piece);
    base += b;
  }
  return out;
}

Shape ShardSpec::local_shape(const Shape& full) const {
  if (!sharded()) return full;
  Shape s = full;
  s[size_t(dim)] = 0;
  for (const auto& [b, e] : ranges(full[size_t(dim)])) s[size_t(dim)] += e - b;
  return s;
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
