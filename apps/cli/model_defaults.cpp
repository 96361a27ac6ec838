#include "model_defaults.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tessera::cli {

std::string default_model(bool* is_test_pipeline) {
  const std::string root = TESSERA_SOURCE_DIR;
  const std::string trained = root + "/models/tessera-shapes";
  *is_test_pipeline = !std::filesystem::exists(trained + "/model_index.json");
  return *is_test_pipeline ? root + "/tests/fixtures/flux1-schnell-tiny" : trained;
}

BundledDefaults bundled_defaults(const std::string& model) {
  const auto read = [](const std::string& path) {
    std::ifstream f(path);
    return f ? nlohmann::json::parse(f, nullptr, false) : nlohmann::json();
  };
  const auto int_field = [](const nlohmann::json& j, const char* key) -> std::optional<int64_t> {
    if (j.is_object() && j.contains(key) && j[key].is_number_integer())
      return j[key].get<int64_t>();
    return std::nullopt;
  };
  return {int_field(read(model + "/vae/config.json"), "sample_size"),
          int_field(read(model + "/tokenizer_2/tokenizer_config.json"), "model_max_length")};
}

}  // namespace tessera::cli
