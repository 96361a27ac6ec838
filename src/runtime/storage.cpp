#include "runtime/storage.h"

#include "runtime/backend.h"

namespace tessera {

static Allocator& allocator_for(const Device& d) { return backend_for(d).allocator(d); }

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, const Device& device) {
  auto s = std::make_shared<Storage>(Token());
  s->data_ = allocator_for(device).allocate(nbytes);
  s->nbytes_ = nbytes;
  s->device_ = device;
  return s;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t nbytes, const Device& device,
                                         std::shared_ptr<const void> keepalive) {
  auto s = std::make_shared<Storage>(Token());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->keepalive_ = keepalive ? std::move(keepalive) : std::make_shared<int>(0);
  return s;
}

Storage::~Storage() {
  if (!keepalive_) allocator_for(device_).deallocate(data_, nbytes_);
}

}  // namespace tessera
