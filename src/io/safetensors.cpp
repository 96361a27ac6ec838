#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "ops/copy.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"

namespace tessera {

using json = nlohmann::json;

namespace {
// Live mappings (start -> size), so advise_mapped only ever touches file-backed pages.
std::mutex g_maps_mu;
std::map<uintptr_t, size_t> g_maps;
}  // namespace

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
    std::lock_guard<std::mutex> lock(g_maps_mu);
    g_maps[reinterpret_cast<uintptr_t>(map)] = size;
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
  if (!map_) return;
  {
    std::lock_guard<std::mutex> lock(g_maps_mu);
    g_maps.erase(reinterpret_cast<uintptr_t>(map_));
  }
  munmap(map_, map_size_);
}

bool advise_mapped(const Tensor& t, MapAdvice advice) {
  if (!t.defined() || t.nbytes() == 0 || !t.impl()->storage) return false;  // pending: not mapped
  const auto& st = t.impl()->storage;
  if (!st || st->owned()) return false;
  const uintptr_t begin =
      reinterpret_cast<uintptr_t>(st->data()) + uintptr_t(t.offset()) * dtype_size(t.dtype());
  const uintptr_t end = begin + t.nbytes();
  {
    std::lock_guard<std::mutex> lock(g_maps_mu);
    auto it = g_maps.upper_bound(begin);
    if (it == g_maps.begin()) return false;
    --it;
    if (end > it->first + it->second) return false;
  }
  // Whole pages only: dont_need on a page shared with a neighbouring tensor just refaults it.
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = begin & ~(page - 1), b = (end + page - 1) & ~(page - 1);
  const int how = advice == MapAdvice::will_need ? MADV_WILLNEED : MADV_DONTNEED;
  return madvise(reinterpret_cast<void*>(a), b - a, how) == 0;
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
