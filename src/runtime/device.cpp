#include "runtime/device.h"

#include <charconv>

#include "runtime/backend.h"
#include "runtime/error.h"

namespace tessera {

Device Device::parse(std::string_view s) {
  auto fail = [&]() {
    TESSERA_FAIL("[device] cannot parse device '", s,
                 "'; expected cpu, cuda[:N], tpu[:N], xla:cpu[:N], xla:cuda[:N] or xla:tpu[:N]");
  };
  const auto colon = s.find(':');
  const std::string_view head = s.substr(0, colon);
  const std::string_view tail = colon == std::string_view::npos ? "" : s.substr(colon + 1);
  Device d;
  if (head == "xla") {  // xla:PLATFORM[:N]
    const auto colon2 = tail.find(':');
    const std::string_view plat = tail.substr(0, colon2);
    if (plat != "cpu" && plat != "cuda" && plat != "tpu") fail();
    d.type = DeviceType::xla;
    d.platform = std::string(plat);
    if (colon2 != std::string_view::npos) {
      const std::string_view idx = tail.substr(colon2 + 1);
      auto [ptr, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), d.index);
      if (idx.empty() || ec != std::errc() || ptr != idx.data() + idx.size() || d.index < 0)
        fail();
    }
    return d;
  }
  if (head == "cpu") d.type = DeviceType::cpu;
  else if (head == "cuda") d.type = DeviceType::cuda;
  else if (head == "tpu") d.type = DeviceType::tpu;
  else fail();
  if (!tail.empty()) {
    auto [ptr, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), d.index);
    if (ec != std::errc() || ptr != tail.data() + tail.size() || d.index < 0) fail();
    if (d.type == DeviceType::cpu && d.index != 0) fail();
  }
  return d;
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda:" + std::to_string(index);
    case DeviceType::tpu: return "tpu:" + std::to_string(index);
    case DeviceType::xla: return "xla:" + platform + (index ? ":" + std::to_string(index) : "");
  }
  return "?";
}

void require_available(const Device& d) {
  // Only d's own backend is asked first: naming cpu must not start an XLA plugin.
  for (Backend* b : backends())
    if (b->device_type() == d.type)
      for (const Device& a : b->devices())
        if (a == d) return;
  std::string avail;
  for (const auto& a : available_devices()) {
    if (a == d) return;
    avail += (avail.empty() ? "" : ", ") + a.str();
  }
  std::string why;
  for (Backend* b : backends())
    if (b->device_type() == d.type) why = b->why_unavailable(d);
  TESSERA_FAIL("[device] ", d.str(), " is not available in this build/machine; available: ",
               avail, why.empty() ? "" : " (" + why + ")");
}

}  // namespace tessera
