// How a tensor is split into equal pieces along one dimension: tensor parallelism's per-rank
// slices (distributed/tensor_parallel.h: one process per rank reads its piece) and SPMD's
// per-device pieces (one process drives N devices of a backend, decision 0060: a storage's
// bytes live split over the devices, piece i on device i).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace tessera {

// Along `dim`, split in `parts` equal pieces, piece `index`; with `packed` (sizes of fused blocks
// along dim, summing to its size) each block is split so and the pieces concatenated.
struct ShardSpec {
  int64_t dim = -1;  // -1: not sharded
  int64_t index = 0, parts = 1;
  std::vector<int64_t> packed;
  bool sharded() const { return dim >= 0 && parts > 1; }
  Shape local_shape(const Shape& full) const;
  // (begin, end) ranges along dim that piece `index` holds, in order.
  std::vector<std::pair<int64_t, int64_t>> ranges(int64_t full_size) const;
};

// A storage split over `spec.parts` devices (SPMD): the storage holds the contiguous bytes of
// a tensor of `shape` and `dtype`; device `first + i` holds piece i (ShardSpec with index i),
// itself contiguous. Set on a device storage before its bytes are written.
struct StorageSharding {
  ShardSpec spec;
  Shape shape;
  DType dtype = DType::f32;
};

// `t` on device `d` as a storage split over `spec.parts` devices of d's backend, starting at d
// (each device receives only its piece). A backend without SPMD refuses it by name.
Tensor to_sharded(const Tensor& t, const Device& d, const ShardSpec& spec);
// An uninitialised tensor on `d` split so (ahead-of-time compilation: shapes only, no bytes).
Tensor empty_sharded(const Shape& shape, DType dtype, const Device& d, const ShardSpec& spec);

}  // namespace tessera
