// safetensors: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the raw bytes. Files are mmapped and tensors are zero-copy views into the map.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessera {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin = 0;  // byte offsets into the data section
  size_t end = 0;
};

// Parses and validates a header (everything after the 8-byte length). `file` names the source
// in error messages. Throws tessera::Error with a one-line message on any malformation.
std::vector<SafetensorsEntry> parse_safetensors_header(const char* json, size_t json_len,
                                                       size_t data_bytes, const std::string& file,
                                                       std::map<std::string, std::string>* metadata);

class SafetensorsFile {
 public:
  // mmaps and validates `path`. Throws "<path>: <problem>" on malformed files.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  // Zero-copy view of the mapped bytes (keeps the file mapped while the tensor lives).
  Tensor get(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const char* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

// Loads every tensor of a file into a name -> tensor map (zero-copy).
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// Writes tensors (any layout; written contiguous) atomically: to a temporary file then renamed,
// so a failure never leaves a half-written file.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera
