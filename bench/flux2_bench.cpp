// One Flux2Transformer2DModel.forward per execution mode on a model folder and a safetensors file
// of its forward() arguments, both written by bench/run_flux2_vs_torch.py (the "flux2-mini"
// workload: FLUX.2's widths, a few blocks of each class, 512x512). Prints one JSON line per mode:
// {"mode", "best_wall_s", "best_cpu_s", "steps"}. Usage: build/bench/flux2_bench --model DIR
// --inputs FILE [--dtype bf16|f32] [--modes eager,defer,compile,regional] [--iters 2]
// [--warmup 1]
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/flux2_transformer.h"
#include "runtime/modes.h"
#include "runtime/primitive.h"

namespace tessera {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int run(int argc, char** argv) {
  std::string model_dir, inputs_file, dtype_name_s = "bf16", modes_s = "eager,regional";
  int iters = 2, warmup = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_dir = v;
    else if (k == "--inputs") inputs_file = v;
    else if (k == "--dtype") dtype_name_s = v;
    else if (k == "--modes") modes_s = v;
    else if (k == "--iters") iters = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else throw std::runtime_error("unknown option " + k);
  }
  if (model_dir.empty() || inputs_file.empty())
    throw std::runtime_error("--model and --inputs are required");
  const DType dtype = dtype_from_name(dtype_name_s);
  auto model = Flux2Transformer2DModel::from_pretrained(model_dir, dtype);
  const auto t = load_safetensors(inputs_file);
  const Flux2TransformerInputs in{t.at("hidden_states"), t.at("encoder_hidden_states"),
                                  t.at("timestep"),      t.at("img_ids"),
                                  t.at("txt_ids"),       t.at("guidance")};
  for (const std::string& m : split(modes_s)) {
    model->reset_compile();
    set_eager_mode(m == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    if (m == "compile") model->compile();
    if (m == "regional") model->compile_repeated_blocks();
    double best_wall = 1e30, best_cpu = 1e30;
    for (int i = 0; i < warmup + iters; ++i) {
      const std::clock_t c0 = std::clock();
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor out = model->forward(in);
      synchronize();
      out.to_floats();  // the result reaches the host, as torch's .float() would
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
      if (i >= warmup) {
        best_wall = std::min(best_wall, wall);
        best_cpu = std::min(best_cpu, cpu);
      }
    }
    std::printf("{\"side\": \"tessera\", \"mode\": \"%s\", \"best_wall_s\": %.4f, "
                "\"best_cpu_s\": %.4f, \"steps\": %d}\n",
                m.c_str(), best_wall, best_cpu, iters);
    std::fflush(stdout);
  }
  set_eager_mode(EagerMode::DeferNever);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  try {
    return tessera::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flux2_bench: error: %s\n", e.what());
    return 1;
  }
}
