// DeviceMesh: the ranks a tensor-parallel model is spread over (torch's DeviceMesh in one
// dimension), one process per device. Ranks index the world process group.
#pragma once
#include <string>
#include <vector>

#include "runtime/device.h"

namespace tessera {

class ProcessGroup;

struct DeviceMesh {
  DeviceMesh() = default;
  // `ranks`: the world ranks in the mesh, in mesh order (TP rank i is ranks[i]).
  DeviceMesh(DeviceType device_type, std::vector<int> ranks);
  DeviceType device_type = DeviceType::cpu;
  std::vector<int> ranks;
  int size() const { return int(ranks.size()); }
  // This process's index in the mesh; throws when it is not a member.
  int local_rank(const ProcessGroup& world) const;
  std::string str() const;  // "cpu[0, 1]"
};

// torch's init_device_mesh("cpu", (n,)): the first n ranks of the world group.
DeviceMesh init_device_mesh(DeviceType device_type, const ProcessGroup& world);

}  // namespace tessera
