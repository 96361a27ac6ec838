// tessera inspect PATH: what a checkpoint file, index, model folder or pipeline folder holds.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "io/checkpoint.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "pipelines/registry.h"
#include "runtime/error.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

struct InspectOptions {
  std::string path;
  bool tensors = false;
};

// Output is collected and printed only when inspection succeeds: an error is the only output.
std::string g_out;

[[gnu::format(printf, 1, 2)]] void say(const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    std::string buf(size_t(n) + 1, '\0');
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    buf.pop_back();
    g_out += buf;
  }
  va_end(ap2);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string dims(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void print_metadata(const std::map<std::string, std::string>& md, const char* indent) {
  if (md.empty()) return;
  say("%smetadata:\n", indent);
  for (const auto& [k, v] : md)
    say("%s  %s = %s\n", indent, printable_name(k).c_str(), printable_name(v, 200).c_str());
}

// Every tensor: name, dtype, shape, bytes (and the shard for sharded checkpoints).
void print_tensors(const CheckpointReader& ckpt, const char* indent) {
  struct Row {
    std::string name, dtype, shape, bytes, shard;
  };
  std::vector<Row> rows;
  size_t w[4] = {4, 5, 5, 5};
  for (const auto& n : ckpt.names()) {
    const SafetensorsEntry& e = ckpt.entry(n);
    Row r{printable_name(n, 200), dtype_name(e.dtype), dims(e.shape),
          std::to_string(e.end - e.begin), ""};
    if (ckpt.sharded()) r.shard = fs::path(ckpt.shard_path(n)).filename().string();
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.dtype.size());
    w[2] = std::max(w[2], r.shape.size());
    w[3] = std::max(w[3], r.bytes.size());
    rows.push_back(std::move(r));
  }
  say("%stensors:\n", indent);
  say("%s  %-*s  %-*s  %-*s  %*s%s\n", indent, int(w[0]), "name", int(w[1]), "dtype", int(w[2]),
      "shape", int(w[3]), "bytes", ckpt.sharded() ? "  shard" : "");
  for (const auto& r : rows)
    say("%s  %-*s  %-*s  %-*s  %*s%s%s\n", indent, int(w[0]), r.name.c_str(), int(w[1]),
        r.dtype.c_str(), int(w[2]), r.shape.c_str(), int(w[3]), r.bytes.c_str(),
        r.shard.empty() ? "" : "  ", r.shard.c_str());
}

void print_checkpoint(const std::string& path) {
  const CheckpointReader ckpt = CheckpointReader::open(path);
  const CheckpointSummary sum = ckpt.summary();  // opens every shard: reports any bad one
  say("checkpoint: %s\n", ckpt.path().c_str());
  if (ckpt.sharded()) say("shards: %zu\n", ckpt.shard_paths().size());
  say("summary: %zu tensors, %s (%llu bytes), dtypes %s\n", sum.tensors,
      human_bytes(sum.bytes).c_str(), (unsigned long long)sum.bytes, sum.dtypes_str().c_str());
  print_metadata(ckpt.metadata(), "");
  print_tensors(ckpt, "");
}

void print_weights(const std::string& weights, bool tensors, const char* indent) {
  if (weights.empty()) return;
  const CheckpointReader ckpt = CheckpointReader::open(weights);
  const CheckpointSummary sum = ckpt.summary();
  std::string shards;
  if (ckpt.sharded()) shards = " (" + std::to_string(ckpt.shard_paths().size()) + " shards)";
  say("%sweights: %s%s: %zu tensors, %s (%llu bytes), dtypes %s\n", indent,
      fs::path(weights).filename().c_str(), shards.c_str(), sum.tensors,
      human_bytes(sum.bytes).c_str(), (unsigned long long)sum.bytes, sum.dtypes_str().c_str());
  if (tensors) print_tensors(ckpt, indent);
}

void print_component_body(const ComponentInfo& c, bool tensors, const char* indent) {
  if (!c.config_path.empty())
    say("%s%s: %s\n", indent, fs::path(c.config_path).filename().c_str(),
        JsonConfig::load(c.config_path).summary().c_str());
  print_weights(c.weights_path, tensors, indent);
  if (c.kind == FolderKind::tokenizer || (c.config_path.empty() && c.weights_path.empty())) {
    std::string files;
    for (const auto& f : c.files) files += (files.empty() ? "" : ", ") + f;
    say("%sfiles: %s\n", indent, files.empty() ? "(none)" : files.c_str());
  }
}

void print_pipeline(const std::string& path, bool tensors) {
  const PipelineFolder p = open_pipeline_folder(path);
  say("pipeline: %s", p.class_name.c_str());
  if (!p.diffusers_version.empty()) say(" (diffusers %s)", p.diffusers_version.c_str());
  say("\npath: %s\n", p.path.c_str());
  if (find_pipeline_class(p.class_name))
    say("tessera: runs %s (generate)\n", p.class_name.c_str());
  else
    say("tessera: does not run %s (it runs %s)\n", p.class_name.c_str(),
        supported_pipeline_classes().c_str());
  say("components:\n");
  for (const auto& c : p.components) {
    if (c.library.empty()) {
      say("  %s: none\n", c.name.c_str());
      continue;
    }
    say("  %s: %s %s%s\n", c.name.c_str(), c.library.c_str(), c.class_name.c_str(),
        c.present ? "" : " (folder missing)");
    if (const ComponentClass* cls = find_component_class(c.class_name)) {
      std::string as = c.name;
      for (size_t i = 0; i < cls->methods.size(); ++i)
        as += (i ? ", " : ".") + std::string(i ? c.name + "." : "") + cls->methods[i];
      say("    tessera: %s (run --component %s)\n", cls->role.c_str(), as.c_str());
    }
    if (c.present) print_component_body(c, tensors, "    ");
  }
}

void inspect_path(const InspectOptions& o) {
  std::error_code ec;
  const fs::path p(o.path);
  if (fs::is_directory(p, ec)) {
    const FolderKind kind = detect_folder_kind(o.path);
    if (kind == FolderKind::pipeline) {
      print_pipeline(o.path, o.tensors);
      return;
    }
    const ComponentInfo c = open_component_folder(o.path);
    TESSERA_CHECK(!c.config_path.empty() || !c.weights_path.empty(), o.path,
                  ": not a model folder (no model_index.json, config.json or .safetensors)");
    say("%s: %s\n", folder_kind_name(c.kind), o.path.c_str());
    print_component_body(c, o.tensors, "");
    return;
  }
  TESSERA_CHECK(fs::exists(p, ec), o.path, ": no such file or folder");
  const std::string name = p.filename().string();
  if (name == "model_index.json") {
    print_pipeline(o.path, o.tensors);
  } else if (ends_with(name, ".index.json") || !ends_with(name, ".json")) {
    print_checkpoint(o.path);
  } else {
    say("config: %s\n%s\n", o.path.c_str(), JsonConfig::load(o.path).summary().c_str());
  }
}

int run_inspect(const InspectOptions& o) {
  g_out.clear();
  inspect_path(o);
  std::fputs(g_out.c_str(), stdout);
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "Show a checkpoint's tensors and metadata, or a model folder's components");
  sub->add_option("path", opts->path,
                  "a .safetensors file, a *.safetensors.index.json, a diffusers pipeline folder "
                  "(model_index.json) or a component / transformers model folder")
      ->required();
  sub->add_flag("--tensors", opts->tensors, "also list every tensor of model folders");
  sub->callback([opts, &run] { run = [opts] { return run_inspect(*opts); }; });
}

}  // namespace tessera::cli
