#include "distributed/device_mesh.h"

#include <set>

#include "distributed/process_group.h"
#include "runtime/error.h"

namespace tessera {

DeviceMesh::DeviceMesh(DeviceType type, std::vector<int> r) : device_type(type), ranks(std::move(r)) {
  TESSERA_CHECK(!ranks.empty(), "[DeviceMesh] a mesh needs at least one rank");
  TESSERA_CHECK(std::set<int>(ranks.begin(), ranks.end()).size() == ranks.size(),
                "[DeviceMesh] ", str(), " lists a rank twice");
  for (int r0 : ranks) TESSERA_CHECK(r0 >= 0, "[DeviceMesh] ", str(), " has a negative rank");
}

int DeviceMesh::local_rank(const ProcessGroup& world) const {
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == world.rank()) return int(i);
  TESSERA_FAIL("[DeviceMesh] rank ", world.rank(), " is not in the mesh ", str());
}

std::string DeviceMesh::str() const {
  std::string s = Device{device_type, 0, ""}.str();
  if (const size_t colon = s.find(":"); colon != std::string::npos) s.resize(colon);
  s += "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

DeviceMesh init_device_mesh(DeviceType device_type, const ProcessGroup& world) {
  std::vector<int> ranks;
  for (int r = 0; r < world.size(); ++r) ranks.push_back(r);
  return DeviceMesh(device_type, ranks);
}

}  // namespace tessera
