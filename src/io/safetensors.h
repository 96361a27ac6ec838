// safetensors: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the raw bytes. Files are mmapped and tensors are zero-copy views into the map.
#pragma once
#include <cstdint>
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

// Largest header accepted, as the reference implementation (a guard against corrupt lengths).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates a header (everything after the 8-byte length). `file` names the source
// in error messages. Throws tessera::Error with a one-line message on any malformation, and
// nothing else (allocation failures included); never reads outside [json, json + json_len).
std::vector<SafetensorsEntry> parse_safetensors_header(
    const char* json, size_t json_len, size_t data_bytes, const std::string& file,
    std::map<std::string, std::string>* metadata);

// Validates a whole file image (length prefix, header, data section bounds). Sets
// *data_start to the byte offset of the data section. Same error contract as above.
std::vector<SafetensorsEntry> parse_safetensors_buffer(const void* bytes, size_t size,
                                                       const std::string& file,
                                                       std::map<std::string, std::string>* metadata,
                                                       size_t* data_start);

// A name made safe for a one-line error message: control characters escaped, long names cut.
std::string printable_name(const std::string& s, size_t max_len = 120);

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
  // Zero-copy view of the mapped bytes (keeps the file mapped while the tensor lives). A tensor
  // whose bytes are not aligned to its element size in the file is copied instead.
  Tensor get(const std::string& name) const;
  // The whole mapping and the size of the data section, for tests and diagnostics.
  const void* mapping() const { return map_; }
  size_t mapping_size() const { return map_size_; }
  size_t data_bytes() const;

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

// Paging advice for a tensor that views a mapped safetensors file; a no-op (false) for any other
// memory. will_need starts reading its pages ahead; dont_need drops them from this process
// (they are read again from the page cache or disk on next use), so offload keeps resident
// memory at what is materialised.
enum class MapAdvice { will_need, dont_need };
bool advise_mapped(const Tensor& t, MapAdvice advice);

// Loads every tensor of a file into a name -> tensor map (zero-copy).
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// Writes tensors (any layout; written contiguous) atomically: to a temporary file then renamed,
// so a failure never leaves a half-written file.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera
