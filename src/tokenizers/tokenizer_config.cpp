#include "tokenizers/tokenizer_config.h"

#include <algorithm>

#include "tokenizers/bpe_tokenizer.h"

namespace tessera::tokenizers {

using nlohmann::json;

json load_tokenizer_config(const std::filesystem::path& dir) {
  json cfg = json::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    json j = read_json_file(dir / "tokenizer_config.json");
    if (j.is_object()) cfg = std::move(j);
  }
  const std::filesystem::path map_path = dir / "special_tokens_map.json";
  if (cfg.contains("added_tokens_decoder") || !std::filesystem::exists(map_path)) return cfg;
  json map = read_json_file(map_path);
  if (!map.is_object()) return cfg;
  for (auto& [key, value] : map.items()) {
    json v = value;
    if (v.is_object()) v["special"] = true;
    cfg[key] = std::move(v);
  }
  return cfg;
}

std::vector<AddedToken> added_tokens_from_config(const json& cfg) {
  std::vector<AddedToken> out;
  if (!cfg.is_object() || !cfg.contains("added_tokens_decoder") ||
      !cfg["added_tokens_decoder"].is_object())
    return out;
  for (auto& [id, t] : cfg["added_tokens_decoder"].items()) {
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string()) continue;
    AddedToken a;
    a.id = std::stoll(id);
    a.content = t["content"].get<std::string>();
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.special = t.value("special", false);
    a.normalized = t.value("normalized", !a.special);
    out.push_back(a);
  }
  std::sort(out.begin(), out.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  return out;
}

std::vector<AddedToken> special_tokens_to_add(const std::vector<json>& values) {
  std::vector<json> seen;  // values as compared: strings, or objects with every field
  std::vector<AddedToken> out;
  for (const json& v : values) {
    AddedToken t;
    json key;
    if (v.is_string()) {
      t.content = v.get<std::string>();
      key = v;
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      t.content = v["content"].get<std::string>();
      t.lstrip = v.value("lstrip", false);
      t.rstrip = v.value("rstrip", false);
      t.single_word = v.value("single_word", false);
      bool special = v.value("special", false);
      t.normalized = v.value("normalized", !special);
      key =
          json{{"content", t.content},         {"lstrip", t.lstrip},         {"rstrip", t.rstrip},
               {"single_word", t.single_word}, {"normalized", t.normalized}, {"special", special}};
    } else {
      continue;
    }
    if (t.content.empty() || std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    t.id = -1;
    t.special = true;
    auto same = std::find_if(out.begin(), out.end(),
                             [&](const AddedToken& a) { return a.content == t.content; });
    if (same != out.end())
      *same = t;
    else
      out.push_back(t);
  }
  return out;
}

json special_token_value(const json& config, const char* key, const char* fallback) {
  if (config.is_object() && config.contains(key) &&
      (config[key].is_string() || config[key].is_object()))
    return config[key];
  return json(fallback);
}

}  // namespace tessera::tokenizers
