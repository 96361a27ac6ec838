#include "nn/pretrained.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/env.h"
#include "runtime/error.h"

namespace tessera {

PretrainedFolder open_pretrained_folder(const std::string& folder, DType dtype,
                                        const char* where) {
  TESSERA_CHECK(dtype == DType::f32 || dtype == DType::bf16, where, " dtype ", dtype_name(dtype),
                " is not supported; use f32 or bf16");
  TESSERA_CHECK(std::filesystem::is_directory(folder), where, " component folder '", folder,
                "' does not exist");
  const std::string config_path = (std::filesystem::path(folder) / "config.json").string();
  TESSERA_CHECK(std::filesystem::exists(config_path), where, " no config.json in '", folder, "'");
  return {folder, config_path, JsonConfig::load(config_path)};
}

void load_checked(Module& model, const WeightSource& source, DType dtype,
                  const std::function<bool(const std::string&)>& ignored,
                  const std::string& config_path, const char* where) {
  LoadOptions options;
  options.dtype = dtype;
  std::vector<std::string> unused;
  for (const auto& n : model.load_weights(source, options))
    if (!ignored || !ignored(n)) unused.push_back(n);
  if (unused.empty()) return;
  std::string names;
  for (size_t i = 0; i < unused.size() && i < 5; ++i) names += (i ? ", " : "") + unused[i];
  TESSERA_FAIL(where, " ", source.describe(), " has ", unused.size(), " tensor(s) that ",
               config_path, " has no place for: ", names, unused.size() > 5 ? ", ..." : "");
}

void apply_environment(Module& model) {
  if (model.repeated_blocks().empty()) return;
  const std::string mode = env::choice(EnvVar::compile);
  if (mode == "full")
    model.compile();
  else if (mode == "regional")
    model.compile_repeated_blocks();
}

}  // namespace tessera
