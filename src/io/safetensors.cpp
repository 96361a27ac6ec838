#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {

using json = nlohmann::json;

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->self_ = f;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TESSERA_FAIL(path, ": not a regular file");
  }
  const size_t size = size_t(st.st_size);
  if (size >= 8) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    TESSERA_CHECK(map != MAP_FAILED, path, ": mmap failed (", std::strerror(err), ")");
    f->map_ = map;  // unmapped by the destructor if parsing throws
    f->map_size_ = size;
  } else {
    ::close(fd);
  }
  char small[8] = {};
  size_t data_start = 0;
  f->entries_ =
      parse_safetensors_buffer(f->map_ ? f->map_ : small, size, path, &f->metadata_, &data_start);
  f->data_ = static_cast<const char*>(f->map_) + data_start;
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_[f->entries_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

size_t SafetensorsFile::data_bytes() const {
  return map_ ? map_size_ - size_t(data_ - static_cast<const char*>(map_)) : 0;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return index_.count(name) > 0;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  TESSERA_CHECK(it != index_.end(), path_, ": no tensor named '", printable_name(name), "'");
  return entries_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const char* p = data_ + e.begin;
  // The mapping is page-aligned, so only the file layout can misalign (odd header padding).
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) != 0) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), p, e.end - e.begin);
    return t;
  }
  return Tensor::from_blob(const_cast<char*>(p), e.shape, e.dtype,
                           std::shared_ptr<const void>(self_.lock()));
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  std::map<std::string, Tensor> out;
  for (const auto& e : f->entries()) out[e.name] = f->get(e.name);
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> data;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: sorted names, as the Python writer
    TESSERA_CHECK(!name.empty() && name != "__metadata__", path, ": cannot save a tensor named '",
                  printable_name(name), "' (reserved or empty)");
    TESSERA_CHECK(t.defined(), path, ": tensor '", printable_name(name), "' is undefined");
    Tensor c = contiguous(t);
    json shape = json::array();
    for (auto d : c.shape()) shape.push_back(d);
    header[name] = {{"dtype", dtype_safetensors_name(c.dtype())},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + c.nbytes()}}};
    offset += c.nbytes();
    data.push_back(c);
  }
  // Invalid UTF-8 in names or metadata is replaced rather than thrown on.
  std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // align the data section to 8 bytes
  write_file_atomically(path, [&](std::FILE* fp) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    bool ok = std::fwrite(len, 1, 8, fp) == 8 &&
              std::fwrite(text.data(), 1, text.size(), fp) == text.size();
    for (const auto& c : data)
      ok = ok && (c.nbytes() == 0 || std::fwrite(c.raw_data(), 1, c.nbytes(), fp) == c.nbytes());
    return ok;
  });
}

}  // namespace tessera
