// Helpers for the io tests: a self-deleting temporary folder and a tiny diffusers pipeline
// folder built from scratch (no reference venv needed).
#pragma once
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/safetensors.h"
#include "runtime/error.h"

namespace tessera::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera_io_XXXXXX").string();
    TESSERA_CHECK(mkdtemp(tmpl.data()) != nullptr, "[test] mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

#ifdef TESSERA_CLI_PATH
// What the CLI printed and its exit code.
struct CliResult {
  int code = -1;
  std::string out, err;
};

// `s` single-quoted for the shell.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the built tessera CLI (TESSERA_CLI_PATH) with `args`, a shell-quoted argument string.
inline CliResult run_cli(const std::string& args) {
  TempDir tmp;
  const std::string err_path = tmp / "stderr";
  const std::string cmd = quote(TESSERA_CLI_PATH) + " " + args + " 2>" + quote(err_path);
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = read_text(err_path);
  return r;
}
#endif

// A FluxPipeline-shaped folder: scheduler, CLIP text encoder (single file), tokenizer files,
// a transformer in two shards, a [null, null] entry and a vae listed but missing.
inline void make_pipeline_folder(const std::string& root) {
  write_text(root + "/model_index.json", R"({
  "_class_name": "FluxPipeline",
  "_diffusers_version": "0.32.0",
  "force_zeros_for_empty_prompt": true,
  "image_encoder": [null, null],
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "CLIPTextModel"],
  "tokenizer": ["transformers", "CLIPTokenizer"],
  "transformer": ["diffusers", "FluxTransformer2DModel"],
  "vae": ["diffusers", "AutoencoderKL"]
})");
  write_text(root + "/scheduler/scheduler_config.json",
             R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0,
                 "use_dynamic_shifting": true, "num_train_timesteps": 1000})");
  write_text(root + "/text_encoder/config.json",
             R"({"architectures": ["CLIPTextModel"], "hidden_size": 8, "num_hidden_layers": 1,
                 "torch_dtype": "bfloat16"})");
  save_safetensors(root + "/text_encoder/model.safetensors",
                   {{"text_model.embeddings.token_embedding.weight",
                     Tensor::from_floats(std::vector<float>(32, 0.5f), {4, 8}, DType::bf16)},
                    {"text_model.final_layer_norm.weight",
                     Tensor::from_floats(std::vector<float>(8, 1.f), {8}, DType::f32)}},
                   {{"format", "pt"}});
  write_text(root + "/tokenizer/vocab.json", R"({"a</w>": 0})");
  write_text(root + "/tokenizer/merges.txt", "#version: 0.2\n");
  write_text(root + "/tokenizer/tokenizer_config.json", R"({"model_max_length": 77})");
  write_text(root + "/transformer/config.json",
             R"({"_class_name": "FluxTransformer2DModel", "num_layers": 1,
                 "num_single_layers": 2, "attention_head_dim": 4, "axes_dims_rope": [2, 2, 0],
                 "guidance_embeds": false})");
  save_safetensors(root + "/transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
                   {{"x_embedder.weight", Tensor::from_floats({1, 2, 3, 4}, {2, 2}, DType::bf16)},
                    {"x_embedder.bias", Tensor::from_floats({5, 6}, {2}, DType::bf16)}});
  save_safetensors(root + "/transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
                   {{"proj_out.weight", Tensor::from_floats({7, 8, 9, 10}, {2, 2}, DType::bf16)}});
  write_text(root + "/transformer/diffusion_pytorch_model.safetensors.index.json", R"({
  "metadata": {"total_size": 20},
  "weight_map": {
    "proj_out.weight": "diffusion_pytorch_model-00002-of-00002.safetensors",
    "x_embedder.bias": "diffusion_pytorch_model-00001-of-00002.safetensors",
    "x_embedder.weight": "diffusion_pytorch_model-00001-of-00002.safetensors"
  }
})");
}

}  // namespace tessera::test
