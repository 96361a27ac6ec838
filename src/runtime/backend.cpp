#include "runtime/backend.h"

#include <array>
#include <utility>

#include "runtime/error.h"
#include "runtime/fusion.h"

namespace tessera {

void Backend::prepare_sharding(const Device& d, int parts, const char* where) {
  TESSERA_FAIL(where, " ", d.str(), " cannot hold a tensor split over ", parts,
               " devices: SPMD programs (one process driving several devices) are an XLA "
               "backend feature (xla:cpu, xla:cuda, tpu); on this device use one process per rank "
               "(tessera launch)");
}

namespace {

struct Registry {
  std::array<Backend*, 8> by_type{};  // indexed by DeviceType
  std::vector<Backend*> list;
};

Registry& raw_registry() {
  static Registry* r = new Registry();  // never destroyed: storages may outlive main
  return *r;
}

Registry& registry() {
  static const bool registered = (register_builtin_backends(), true);
  (void)registered;
  return raw_registry();
}

}  // namespace

void register_backend(std::unique_ptr<Backend> backend) {
  Registry& r = raw_registry();
  const size_t t = size_t(backend->device_type());
  TESSERA_CHECK(t < r.by_type.size() && !r.by_type[t], "[device] a second backend for ",
                backend->name());
  r.by_type[t] = backend.release();
  r.list.push_back(r.by_type[t]);
}

std::unique_ptr<Backend> unregister_backend(DeviceType t) {
  Registry& r = registry();
  const size_t i = size_t(t);
  TESSERA_CHECK(i < r.by_type.size() && r.by_type[i], "[device] no backend to unregister");
  std::erase(r.list, r.by_type[i]);
  // Registered backends are never freed (storages may outlive main); this one goes back to the
  // caller, who registered it and now owns it again.
  return std::unique_ptr<Backend>(std::exchange(r.by_type[i], nullptr));
}

const std::vector<Backend*>& backends() { return registry().list; }

Backend& backend_for(const Device& d) {
  const size_t t = size_t(d.type);
  Backend* b = t < registry().by_type.size() ? registry().by_type[t] : nullptr;
  if (b) [[likely]]
    return *b;
  require_available(d);  // throws: nothing handles this device type
  TESSERA_FAIL("[device] no backend for ", d.str());
}

void wait_all_streams() {
  for (Backend* b : backends())
    for (const Device& d : b->started_devices()) b->synchronize(d);
}

bool fusion_supported(const Device& d) {
  static const FusedKernel probe({}, {}, "fused");
  return backend_for(d).supports(probe, {});
}

std::vector<Device> available_devices() {
  std::vector<Device> out;
  for (Backend* b : backends())
    for (const Device& d : b->devices()) out.push_back(d);
  return out;
}

}  // namespace tessera
