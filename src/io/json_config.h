// Read access to config.json / model_index.json / scheduler_config.json with errors that name
// the file and the key: "missing key 'num_layers' in /m/transformer/config.json".
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

class JsonConfig {
 public:
  JsonConfig() : root_(nlohmann::json::object()) {}
  // Parses `path`; the top level must be an object.
  static JsonConfig load(const std::string& path);
  // Wraps a parsed object; `source` names it in errors (a file path).
  static JsonConfig from_json(nlohmann::json value, std::string source, std::string prefix = "");

  const std::string& source() const { return source_; }
  const nlohmann::json& raw() const { return root_; }
  std::vector<std::string> keys() const;   // sorted
  bool has(const std::string& key) const;  // present and not null

  // Required values: missing key, null or wrong type throw.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // any JSON number
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  std::vector<double> get_float_list(const std::string& key) const;
  std::vector<std::string> get_string_list(const std::string& key) const;
  JsonConfig get_object(const std::string& key) const;  // nested object (errors say "a.b")

  // Optional values: missing or null give `fallback`; a present value of the wrong type throws.
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  // One line "key=value, ..." with compact JSON values (long values cut), keys starting with
  // '_' left out; for `tessera inspect`.
  std::string summary(size_t max_value_chars = 80) const;

 private:
  const nlohmann::json& at(const std::string& key) const;  // throws when missing or null
  [[noreturn]] void type_error(const std::string& key, const char* expected) const;
  nlohmann::json root_;
  std::string source_;
  std::string prefix_;  // "vision_config." for nested objects
};

}  // namespace tessera
