// Tensor parallelism: how a weight is split over the ranks of a mesh, and the per-rank read of
// its slice from a checkpoint. diffusers' ParallelStyle names: colwise (a Linear's output
// features; its weight rows and bias), rowwise (its input features; weight columns, the output an
// all-reduce of partial sums, the bias added once after it); "packed" variants split each of
// several fused parts (FLUX's single blocks' proj_out reads [attention, MLP]) on its own.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "distributed/device_mesh.h"
#include "distributed/process_group.h"
#include "runtime/tensor.h"

namespace tessera {

// What from_pretrained takes to shard a model (diffusers' TensorParallelConfig(mesh=...)).
struct TensorParallelConfig {
  DeviceMesh mesh;
  std::shared_ptr<ProcessGroup> group;  // the collectives among the mesh's ranks
  int degree() const { return mesh.size(); }
  int rank() const { return group ? group->rank() : 0; }
  // The mesh over every rank of the default group (init_process_group first); `expected`: the
  // degree asked for (--tp), which must equal the number of ranks launched.
  static TensorParallelConfig over_world(int expected, const char* where);
};

enum class ParallelStyle { replicate, colwise, rowwise };
const char* parallel_style_name(ParallelStyle style);

// This rank's part of one parameter: along `dim`, split in `parts` equal pieces, piece `index`;
// with `packed` (sizes of fused blocks along dim, summing to its size) each block is split so and
// the pieces concatenated.
struct ShardSpec {
  int64_t dim = -1;  // -1: not sharded
  int64_t index = 0, parts = 1;
  std::vector<int64_t> packed;
  bool sharded() const { return dim >= 0 && parts > 1; }
  Shape local_shape(const Shape& full) const;
  // (begin, end) ranges along dim that this rank reads, in order.
  std::vector<std::pair<int64_t, int64_t>> ranges(int64_t full_size) const;
};

// The slice of `full` (a zero-copy view of a checkpoint's memory map) this rank keeps, as a
// contiguous tensor: rows (dim 0) are one contiguous byte range; columns are strided reads of
// each row's range. Only those bytes are read; `full` is never materialised.
Tensor read_shard(const Tensor& full, const ShardSpec& spec);

}  // namespace tessera
