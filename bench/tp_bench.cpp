// Tensor-parallel FLUX.1 transformer steps (issue 23): one FluxTransformer2DModel.forward per
// step, TP=1 as a plain process, TP=N when started by mpirun with N ranks (each rank reads only
// its slices). bench/run_tp_bench.sh runs both in one go and prints the per-step ratio.
//   build/bench/tp_bench --model DIR [--dtype f32|bf16] [--size 512] [--txt 512] [--steps 3]
//                        [--warmup 1]
// Prints one JSON line (rank 0): {"tp", "threads", "load_s", "weight_bytes" (this rank's
// parameters), "steps_s": [...] (wall), "median_step_s", "cpu_s": [...] (rank 0's CPU seconds)}.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>

#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "flux_bench_inputs.h"
#include "models/flux_transformer.h"
#include "runtime/parallel.h"
#include "runtime/primitive.h"

namespace tessera {
namespace {

// This process's CPU seconds (all its threads): what a step costs a rank, whatever else the
// machine runs.
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run(int argc, char** argv) {
  std::string model, dtype_name_ = "f32";
  int64_t size = 512, txt = 512;
  int steps = 3, warmup = 1;
  CLI::App app{"tensor-parallel FLUX.1 transformer steps"};
  app.add_option("--model", model, "transformer folder")->required();
  app.add_option("--dtype", dtype_name_);
  app.add_option("--size", size);
  app.add_option("--txt", txt);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  CLI11_PARSE(app, argc, argv);
  const DType dtype = dtype_from_name(dtype_name_);

  std::optional<TensorParallelConfig> tp;
  if (launched_by_mpirun()) {
    auto world = init_process_group("mpi");
    tp = TensorParallelConfig::over_world(world->size(), "[tp_bench]");
  }
  const bool writer = !tp || tp->rank() == 0;
  const double t0 = now();
  auto m = FluxTransformer2DModel::from_pretrained(model, dtype, tp ? &*tp : nullptr);
  int64_t read = 0;
  for (const auto& p : m->named_parameters())
    if (p.slot->defined()) read += int64_t(p.slot->nbytes());
  const double load_s = now() - t0;
  const FluxTransformerInputs in = bench::random_flux_inputs(m->config, size, size, txt, dtype);
  std::vector<double> times, cpu;
  for (int i = 0; i < warmup + steps; ++i) {
    if (tp) tp->group->barrier();  // every rank starts the step together
    const double s = now(), c = cpu_now();
    const Tensor out = m->forward(in);
    out.raw_data();  // a sync point
    synchronize();
    if (i >= warmup) {
      times.push_back(now() - s);
      cpu.push_back(cpu_now() - c);
    }
  }
  if (writer) {
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    std::printf("{\"tp\": %d, \"threads\": %d, \"load_s\": %.3f, \"weight_bytes\": %lld, "
                "\"steps_s\": [",
                tp ? tp->degree() : 1, num_threads(), load_s, (long long)read);
    for (size_t i = 0; i < times.size(); ++i) std::printf("%s%.4f", i ? ", " : "", times[i]);
    std::printf("], \"median_step_s\": %.4f, \"cpu_s\": [", sorted[sorted.size() / 2]);
    for (size_t i = 0; i < cpu.size(); ++i) std::printf("%s%.4f", i ? ", " : "", cpu[i]);
    std::printf("]}\n");
    std::fflush(stdout);
  }
  if (tp) destroy_process_group();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::run(argc, argv); }
