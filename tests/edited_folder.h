// A fixture component folder copied with its config.json edited (and optionally its tensors
// renamed), for the model loaders' error tests; shared by the CLIP, T5, VAE and FLUX tests.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io_test_folder.h"
#include "runtime/dtype.h"
#include "test_util.h"

namespace tessera::test {

// True when the fixture component folder (with its config.json) exists.
inline bool has_component(const std::string& folder) {
  return has_fixture(folder + "/config.json");
}

// A copy of fixture folder `component` (relative to tests/fixtures): `edit` changes config.json;
// `rename` maps tensor names in the safetensors files and in a sharded index's weight_map (an
// empty new name drops the tensor).
class EditedFolder {
 public:
  using Edit = std::function<void(nlohmann::json&)>;
  using Rename = std::function<std::string(const std::string&)>;

  EditedFolder(const std::string& component, const Edit& edit, const Rename& rename = nullptr) {
    const std::string src = fixture_path(component);
    for (const auto& e : std::filesystem::directory_iterator(src)) {
      const std::string name = e.path().filename().string();
      const auto ends_with = [&](const std::string& s) {
        return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
      };
      if (rename && ends_with(".safetensors")) {
        std::map<std::string, Tensor> renamed;
        for (const auto& [k, v] : load_safetensors(e.path().string())) {
          const std::string nk = rename(k);
          if (!nk.empty()) renamed[nk] = v;
        }
        save_safetensors(dir_ / name, renamed);
      } else if (rename && ends_with(".json") && name != "config.json") {
        nlohmann::json index = nlohmann::json::parse(read_text(e.path().string()));
        nlohmann::json map = nlohmann::json::object();
        for (auto& [k, v] : index["weight_map"].items())
          if (const std::string nk = rename(k); !nk.empty()) map[nk] = v;
        index["weight_map"] = map;
        write_text(dir_ / name, index.dump(2));
      } else {
        std::filesystem::copy(e.path(), dir_ / name);
      }
    }
    nlohmann::json cfg = nlohmann::json::parse(read_text(src + "/config.json"));
    edit(cfg);
    std::filesystem::remove(dir_ / "config.json");
    write_text(dir_ / "config.json", cfg.dump(2));
  }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
};

// The error message of Model::from_pretrained(folder, dtype), or "" when it loads.
template <typename Model>
std::string load_error(const std::string& folder, DType dtype = DType::f32) {
  return error_message([&] { Model::from_pretrained(folder, dtype); });
}

}  // namespace tessera::test
