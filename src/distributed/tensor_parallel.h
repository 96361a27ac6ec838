// Tensor parallelism: how a weight is split over the ranks of a mesh, and the per-rank read of
// its slice from a checkpoint. diffusers' ParallelStyle names: colwise (a Linear's output
// features; its weight rows and bias), rowwise (its input features; weight columns, the output an
// all-reduce of partial sums, the bias added once after it); "packed" variants split each of
// several fused parts (FLUX's single blocks' proj_out reads [attention, MLP]) on its own.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/device_mesh.h"
#include "distributed/process_group.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"

namespace tessera {

// What from_pretrained takes to shard a model (diffusers' TensorParallelConfig(mesh=...)).
struct TensorParallelConfig {
  DeviceMesh mesh;
  std::shared_ptr<ProcessGroup> group;  // the collectives among the mesh's ranks
  // SPMD (decision 0060): one process drives the mesh's devices, from this XLA device on
  // (mesh ranks are device indices, no group). Weights keep their whole shapes and are stored
  // split over the devices by the plan; XLA's partitioner splits the program and inserts the
  // collectives.
  std::optional<Device> spmd_device;
  bool spmd() const { return spmd_device.has_value(); }
  int degree() const { return mesh.size(); }
  int rank() const { return group ? group->rank() : 0; }
  // The mesh over every rank of the default group (init_process_group first); `expected`: the
  // degree asked for (--tp), which must equal the number of ranks launched.
  static TensorParallelConfig over_world(int expected, const char* where);
  // SPMD over `n` devices of `first`'s backend from `first` on (xla:cpu, xla:cuda, tpu); readies
  // them (xla:cpu starts its plugin with n devices when it has not started). Throws naming
  // `where` for a device without SPMD programs or too few devices.
  static TensorParallelConfig over_devices(const Device& first, int n, const char* where);
};

enum class ParallelStyle { replicate, colwise, rowwise };
const char* parallel_style_name(ParallelStyle style);

// This rank's part of one parameter: ShardSpec (runtime/sharding.h) with index = the rank.

// The slice of `full` (a zero-copy view of a checkpoint's memory map) this rank keeps, as a
// contiguous tensor: rows (dim 0) are one contiguous byte range; columns are strided reads of
// each row's range. Only those bytes are read; `full` is never materialised.
Tensor read_shard(const Tensor& full, const ShardSpec& spec);

}  // namespace tessera
