// One SD3 transformer step (SD3Transformer2DModel.forward, the classifier-free-guidance batch)
// per execution mode, for the "sd35-mini" comparison of issue 21 (SD3.5-medium's widths, 2
// dual-attention + 2 joint blocks; weights written by bench/run_sd3_vs_torch.py). Side by side
// with diffusers: bench/run_sd3_vs_torch.py. Alone:
//   build/bench/sd3_bench --model DIR [--dtype bf16] [--size 512] [--txt 333] [--batch 2]
//       [--modes eager,defer,compile,regional] [--warmup 1] [--iters 2]
// Inputs are torch.randn(seed 0) draws, in this order: latents (B, C, size/8, size/8), text
// (B, txt, joint_attention_dim), pooled (B, pooled_projection_dim); timestep 500. One JSON
// object per mode on stdout: best wall and CPU milliseconds of the timed steps and the step's
// matmul + attention FLOPs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "models/sd3_transformer.h"
#include "ops/copy.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/parallel.h"
#include "runtime/primitive.h"
#include "runtime/random.h"

namespace tessera {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Matmul + attention FLOPs of one forward over `batch` sequences of img + txt tokens.
double step_flops(const SD3TransformerConfig& c, int64_t img, int64_t txt, int64_t batch) {
  const double d = double(c.inner_dim()), I = double(img), T = double(txt), L = I + T;
  const double p2 = double(c.patch_size * c.patch_size);
  double f = 2.0 * I * p2 * c.in_channels * d + 2.0 * T * c.joint_attention_dim * d;
  f += 2.0 * (256.0 * d + d * d) + 2.0 * (c.pooled_projection_dim * d + d * d);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool last = l == c.num_layers - 1, dual = c.dual_attention(l);
    f += 2.0 * d * d * ((dual ? 9.0 : 6.0) + (last ? 2.0 : 6.0));  // modulations
    f += 2.0 * L * 3.0 * d * d + 4.0 * L * L * d;                  // q/k/v, joint SDPA
    f += 2.0 * (I + (last ? 0.0 : T)) * d * d;                     // to_out, to_add_out
    f += 16.0 * d * d * (I + (last ? 0.0 : T));                    // ff, ff_context
    if (dual) f += 2.0 * I * 4.0 * d * d + 4.0 * I * I * d;        // attn2
  }
  f += 2.0 * d * 2.0 * d + 2.0 * I * d * p2 * c.out_channels;  // norm_out, proj_out
  return f * double(batch);
}

int run(int argc, char** argv) {
  std::string model_dir, dtype = "bf16", modes = "eager,defer,compile,regional";
  int64_t size = 512, txt = 333, batch = 2, warmup = 1, iters = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      model_dir = v;
    else if (k == "--dtype")
      dtype = v;
    else if (k == "--modes")
      modes = v;
    else if (k == "--size")
      size = std::stoll(v);
    else if (k == "--txt")
      txt = std::stoll(v);
    else if (k == "--batch")
      batch = std::stoll(v);
    else if (k == "--warmup")
      warmup = std::stoll(v);
    else if (k == "--iters")
      iters = std::stoll(v);
    else
      TESSERA_FAIL("[sd3_bench] unknown flag ", k);
  }
  TESSERA_CHECK(!model_dir.empty(), "[sd3_bench] --model DIR is required");
  const DType dt = dtype_from_name(dtype);
  auto model = SD3Transformer2DModel::from_pretrained(model_dir, dt);
  const auto& c = model->config;
  Generator g(0);
  auto draw = [&](Shape shape) { return astype(randn(shape, DType::f32, g), dt); };
  SD3TransformerInputs in;
  in.hidden_states = draw({batch, c.in_channels, size / 8, size / 8});
  in.encoder_hidden_states = draw({batch, txt, c.joint_attention_dim});
  in.pooled_projections = draw({batch, c.pooled_projection_dim});
  in.timestep = Tensor::from_floats(std::vector<float>(size_t(batch), 500.f), {batch});
  const int64_t img = (size / 8 / c.patch_size) * (size / 8 / c.patch_size);
  const double flops = step_flops(c, img, txt, batch);
  for (const std::string& m : split(modes)) {
    model->reset_compile();
    set_eager_mode(m == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    if (m == "compile") model->compile();
    if (m == "regional") model->compile_repeated_blocks();
    TESSERA_CHECK(m == "eager" || m == "defer" || m == "compile" || m == "regional",
                  "[sd3_bench] unknown mode '", m, "'");
    auto step = [&] {
      const std::clock_t c0 = std::clock();
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor y = model->forward(in);
      synchronize();
      return std::pair<double, double>{
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          double(std::clock() - c0) / CLOCKS_PER_SEC};
    };
    const auto w0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < warmup; ++i) step();
    const double warm_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    double best_wall = 1e30, best_cpu = 1e30;
    for (int64_t i = 0; i < iters; ++i) {
      const auto [w, cpu] = step();
      best_wall = std::min(best_wall, w);
      best_cpu = std::min(best_cpu, cpu);
    }
    std::printf(
        "{\"mode\": \"%s\", \"dtype\": \"%s\", \"size\": %lld, \"txt\": %lld, \"batch\": %lld, "
        "\"threads\": %d, \"GFLOP\": %.1f, \"best_ms\": %.1f, \"best_cpu_ms\": %.1f, "
        "\"warmup_s\": %.1f}\n",
        m.c_str(), dtype.c_str(), (long long)size, (long long)txt, (long long)batch,
        int(num_threads()), flops / 1e9, best_wall * 1e3, best_cpu * 1e3, warm_s);
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
    std::fprintf(stderr, "sd3_bench: error: %s\n", e.what());
    return 1;
  }
}
