// Where a tensor lives: "cpu", "cuda:i", "tpu:i", "xla:cpu", "xla:cuda".
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

enum class DeviceType : uint8_t { cpu, cuda, tpu, xla };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  std::string platform;  // for xla: the PJRT plugin name ("cpu", "cuda", "tpu")

  static Device cpu() { return {}; }
  // Parses "cpu", "cuda", "cuda:1", "tpu:0", "xla:cpu". Throws with the accepted forms.
  static Device parse(std::string_view s);
  std::string str() const;
  bool operator==(const Device& o) const {
    return type == o.type && index == o.index && platform == o.platform;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Devices this build can run on right now: those of the registered backends
// (runtime/backend.h) that are present on this machine.
std::vector<Device> available_devices();
// Throws "[device] cuda:0 is not available; available: cpu" when `d` cannot be used.
void require_available(const Device& d);

}  // namespace tessera
