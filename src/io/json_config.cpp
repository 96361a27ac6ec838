#include "io/json_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace tessera {

using json = nlohmann::json;

JsonConfig JsonConfig::load(const std::string& path) {
  std::error_code ec;
  TESSERA_CHECK(!std::filesystem::is_directory(path, ec), path,
                ": is a folder, expected a JSON file");
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in, path, ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error& e) {
    TESSERA_FAIL(path, ": invalid JSON (syntax error at byte ", e.byte, ")");
  } catch (const std::exception& e) {
    TESSERA_FAIL(path, ": cannot parse JSON");
  }
  TESSERA_CHECK(value.is_object(), path, ": top level is a JSON ", value.type_name(),
                ", expected an object");
  return from_json(std::move(value), path);
}

JsonConfig JsonConfig::from_json(json value, std::string source, std::string prefix) {
  TESSERA_CHECK(value.is_object(), source, ": ", prefix.empty() ? "top level" : prefix, " is a ",
                value.type_name(), ", expected an object");
  JsonConfig c;
  c.root_ = std::move(value);
  c.source_ = std::move(source);
  c.prefix_ = std::move(prefix);
  return c;
}

std::vector<std::string> JsonConfig::keys() const {
  std::vector<std::string> out;
  for (auto it = root_.begin(); it != root_.end(); ++it) out.push_back(it.key());
  return out;
}

bool JsonConfig::has(const std::string& key) const {
  auto it = root_.find(key);
  return it != root_.end() && !it->is_null();
}

const json& JsonConfig::at(const std::string& key) const {
  auto it = root_.find(key);
  TESSERA_CHECK(it != root_.end(), "missing key '", prefix_, key, "' in ", source_);
  TESSERA_CHECK(!it->is_null(), "key '", prefix_, key, "' in ", source_, " is null");
  return *it;
}

void JsonConfig::type_error(const std::string& key, const char* expected) const {
  TESSERA_FAIL("key '", prefix_, key, "' in ", source_, " is a ", root_.at(key).type_name(), " (",
               root_.at(key).dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 60),
               "), expected ", expected);
}

static bool integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18;
}

static int64_t as_int(const json& v) {
  if (v.is_number_unsigned()) return int64_t(v.get<uint64_t>());
  if (v.is_number_integer()) return v.get<int64_t>();
  return int64_t(v.get<double>());
}

int64_t JsonConfig::get_int(const std::string& key) const {
  const json& v = at(key);
  if (!integral(v) || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    type_error(key, "an integer");
  return as_int(v);
}

double JsonConfig::get_float(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_number()) type_error(key, "a number");
  return v.get<double>();
}

bool JsonConfig::get_bool(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_boolean()) type_error(key, "true or false");
  return v.get<bool>();
}

std::string JsonConfig::get_string(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_string()) type_error(key, "a string");
  return v.get<std::string>();
}

std::vector<int64_t> JsonConfig::get_int_list(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) type_error(key, "a list of integers");
  std::vector<int64_t> out;
  for (const auto& e : v) {
    if (!integral(e)) type_error(key, "a list of integers");
    out.push_back(as_int(e));
  }
  return out;
}

std::vector<double> JsonConfig::get_float_list(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) type_error(key, "a list of numbers");
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) type_error(key, "a list of numbers");
    out.push_back(e.get<double>());
  }
  return out;
}

std::vector<std::string> JsonConfig::get_string_list(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) type_error(key, "a list of strings");
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) type_error(key, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

JsonConfig JsonConfig::get_object(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_object()) type_error(key, "an object");
  return from_json(v, source_, prefix_ + key + ".");
}

int64_t JsonConfig::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double JsonConfig::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool JsonConfig::get_bool(const std::string& key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}
std::string JsonConfig::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::string JsonConfig::summary(size_t max_value_chars) const {
  std::string out;
  for (auto it = root_.begin(); it != root_.end(); ++it) {
    if (!it.key().empty() && it.key()[0] == '_') continue;
    std::string v = it->dump(-1, ' ', false, json::error_handler_t::replace);
    if (v.size() > max_value_chars) v = v.substr(0, max_value_chars) + "...";
    if (!out.empty()) out += ", ";
    out += it.key() + "=" + v;
  }
  return out;
}

}  // namespace tessera
