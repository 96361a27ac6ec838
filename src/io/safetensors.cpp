#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ops/copy.h"
#include "runtime/error.h"

namespace tessera {

using json = nlohmann::json;

std::vector<SafetensorsEntry> parse_safetensors_header(const char* text, size_t len,
                                                       size_t data_bytes, const std::string& file,
                                                       std::map<std::string, std::string>* metadata) {
  json header = json::parse(text, text + len, nullptr, /*allow_exceptions=*/false);
  TESSERA_CHECK(!header.is_discarded(), file, ": header is not valid JSON");
  TESSERA_CHECK(header.is_object(), file, ": header is not a JSON object");
  std::vector<SafetensorsEntry> entries;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      TESSERA_CHECK(value.is_object(), file, ": __metadata__ is not an object");
      for (auto& [k, v] : value.items()) {
        TESSERA_CHECK(v.is_string(), file, ": __metadata__ value for '", k, "' is not a string");
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    TESSERA_CHECK(value.is_object(), file, ": tensor '", name, "' entry is not an object");
    auto dt = value.find("dtype");
    auto sh = value.find("shape");
    auto off = value.find("data_offsets");
    TESSERA_CHECK(dt != value.end() && dt->is_string(), file, ": tensor '", name,
                  "' has no dtype string");
    TESSERA_CHECK(sh != value.end() && sh->is_array(), file, ": tensor '", name,
                  "' has no shape array");
    TESSERA_CHECK(off != value.end() && off->is_array() && off->size() == 2, file, ": tensor '",
                  name, "' has no data_offsets [begin, end]");
    SafetensorsEntry e;
    e.name = name;
    TESSERA_CHECK(dtype_from_safetensors_name(dt->get<std::string>(), &e.dtype), file,
                  ": tensor '", name, "' has unknown dtype '", dt->get<std::string>(), "'");
    uint64_t numel = 1;
    for (auto& d : *sh) {
      TESSERA_CHECK(d.is_number_unsigned(), file, ": tensor '", name,
                    "' shape has a non-integer or negative dimension");
      const uint64_t v = d.get<uint64_t>();
      TESSERA_CHECK(v < (1ull << 40) && (v == 0 || numel <= (1ull << 50) / v), file, ": tensor '",
                    name, "' shape is too large");
      numel *= v;
      e.shape.push_back(int64_t(v));
    }
    for (auto& o : *off)
      TESSERA_CHECK(o.is_number_unsigned(), file, ": tensor '", name,
                    "' data_offsets are not non-negative integers");
    const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
    TESSERA_CHECK(b <= en && en <= data_bytes, file, ": tensor '", name, "' offsets [", b, ", ",
                  en, "] are out of range (data section is ", data_bytes, " bytes)");
    TESSERA_CHECK(en - b == numel * dtype_size(e.dtype), file, ": tensor '", name, "' shape ",
                  shape_str(e.shape), " of ", dt->get<std::string>(), " needs ",
                  numel * dtype_size(e.dtype), " bytes but offsets give ", en - b);
    e.begin = size_t(b);
    e.end = size_t(en);
    entries.push_back(std::move(e));
  }
  // Tensors must not overlap.
  std::vector<const SafetensorsEntry*> sorted;
  for (auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  for (size_t i = 1; i < sorted.size(); ++i) {
    TESSERA_CHECK(sorted[i]->begin >= sorted[i - 1]->end || sorted[i - 1]->begin == sorted[i - 1]->end,
                  file, ": tensors '", sorted[i - 1]->name, "' and '", sorted[i]->name,
                  "' overlap");
  }
  return entries;
}

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
  if (size < 8) {
    ::close(fd);
    TESSERA_FAIL(path, ": truncated file (", size, " bytes; a safetensors file starts with an ",
                 "8-byte header length)");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  TESSERA_CHECK(map != MAP_FAILED, path, ": mmap failed (", std::strerror(errno), ")");
  f->map_ = map;
  f->map_size_ = size;
  uint64_t header_len = 0;
  std::memcpy(&header_len, map, 8);
  TESSERA_CHECK(header_len <= size - 8, path, ": header length ", header_len,
                " runs past the end of the file (", size, " bytes)");
  const char* header = static_cast<const char*>(map) + 8;
  f->data_ = header + header_len;
  f->entries_ = parse_safetensors_header(header, size_t(header_len), size - 8 - size_t(header_len),
                                         path, &f->metadata_);
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_[f->entries_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) > 0; }

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  TESSERA_CHECK(it != index_.end(), path_, ": no tensor named '", name, "'");
  return entries_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return Tensor::from_blob(const_cast<char*>(data_ + e.begin), e.shape, e.dtype,
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
    Tensor c = contiguous(t);
    json shape = json::array();
    for (auto d : c.shape()) shape.push_back(d);
    header[name] = {{"dtype", dtype_safetensors_name(c.dtype())},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + c.nbytes()}}};
    offset += c.nbytes();
    data.push_back(c);
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // align the data section to 8 bytes
  const std::string tmp = path + ".tmp";
  FILE* fp = std::fopen(tmp.c_str(), "wb");
  TESSERA_CHECK(fp, path, ": cannot write (", std::strerror(errno), ")");
  const uint64_t len = text.size();
  bool ok = std::fwrite(&len, 8, 1, fp) == 1 && std::fwrite(text.data(), 1, text.size(), fp) == text.size();
  for (const auto& c : data)
    ok = ok && (c.nbytes() == 0 || std::fwrite(c.raw_data(), 1, c.nbytes(), fp) == c.nbytes());
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    TESSERA_FAIL(path, ": write failed (", std::strerror(errno), ")");
  }
}

}  // namespace tessera
