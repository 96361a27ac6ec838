// The XLA backend through the XLA CPU PJRT plugin (decisions 0030-0032): the client, buffers,
// cached per-op executables, views, dtype conversions with torch's rounding, the errors. The
// conformance suite (tests/xla.cmake) runs every op family on xla:cpu against the CPU.
#include <gtest/gtest.h>

#ifdef TESSERA_HAS_XLA
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/xla/pjrt_client.h"
#include "backends/xla/xla_backend.h"
#include "component_goldens.h"
#include "conformance_cases.h"
#include "models/flux_transformer.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/reduce.h"
#include "ops/softmax.h"
#include "pipeline_manifest.h"
#include "pipelines/flux_pipeline.h"
#include "runtime/backend.h"
#include "runtime/modes.h"
#include "test_util.h"

namespace tessera {
namespace {

const Device kXla = Device::parse("xla:cpu");

// A primitive no backend lowers: the XLA fallback's subject.
class Twice final : public Primitive {
 public:
  const char* name() const override { return "twice_for_test"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    const std::vector<float> v = in[0].to_floats();
    float* o = out[0].data<float>();
    for (size_t i = 0; i < v.size(); ++i) o[i] = 2.f * v[i];
  }
};

class Xla : public ::testing::Test {
 protected:
  void SetUp() override {
    bool found = false;
    for (const Device& d : available_devices()) found = found || d == kXla;
    if (!found) GTEST_SKIP() << "no xla:cpu (plugin not installed or TESSERA_PJRT_PLUGIN=none)";
  }
};

Tensor seq(const Shape& s, DType dt = DType::f32, float scale = 0.37f) {
  std::vector<float> v(size_t(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * scale) * 3.f;
  return Tensor::from_floats(v, s, dt);
}

TEST_F(Xla, DevicesParseAndPrint) {
  EXPECT_EQ(Device::parse("xla:cpu").str(), "xla:cpu");
  EXPECT_EQ(Device::parse("xla:cpu:1").str(), "xla:cpu:1");
  EXPECT_EQ(Device::parse("tpu:2").str(), "tpu:2");
  EXPECT_THROW(Device::parse("xla:cpu:x"), Error);
  EXPECT_THROW(Device::parse("xla:gpu"), Error);
  // One device (cpu_device_count = 1); another index is a clear error.
  const std::string e =
      test::error_message([] { Tensor::empty({2}, DType::f32, Device::parse("xla:cpu:3")); });
  EXPECT_NE(e.find("xla:cpu:3 is out of range"), std::string::npos) << e;
}

TEST_F(Xla, RoundTripAndAddCompileOnceThenHit) {
  reset_xla_stats();
  const Tensor a = seq({8}), b = seq({8}, DType::f32, 0.11f);
  const Tensor xa = a.to(kXla), xb = b.to(kXla);
  EXPECT_TRUE(test::bit_equal(xa.to(Device::cpu()), a));
  const auto t0 = std::chrono::steady_clock::now();
  Tensor y = add(xa, xb);
  const Tensor back = y.to(Device::cpu());
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(test::bit_equal(back, add(a, b)));
  EXPECT_EQ(xla_stats().compiles, 1);
  const int n = 200;
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) y = add(xa, xb);
  synchronize(kXla);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count() / n;
  EXPECT_EQ(xla_stats().compiles, 1);
  EXPECT_GE(xla_stats().cache_hits, n);
  std::printf("[xla] f32[8] add: first call (compile) %.1f ms, cached op %.2f us\n", first_ms, us);
}

TEST_F(Xla, ViewsAsInputs) {
  const Tensor x = seq({4, 6, 5});
  const Tensor xx = x.to(kXla);
  auto same = [&](const Tensor& dev, const Tensor& host) {
    EXPECT_TRUE(test::bit_equal(contiguous(dev).to(Device::cpu()), contiguous(host)));
  };
  same(xx.transpose(0, 2), x.transpose(0, 2));
  same(xx.slice(1, 1, 5, 2), x.slice(1, 1, 5, 2));
  same(xx.select(0, 2).slice(1, 1, 4), x.select(0, 2).slice(1, 1, 4));
  same(xx.slice(2, 2, 3).expand({4, 6, 7}), x.slice(2, 2, 3).expand({4, 6, 7}));
  same(xx.permute({1, 2, 0}).slice(0, 3, 6), x.permute({1, 2, 0}).slice(0, 3, 6));
  // A host read of a view (to_floats) goes through a host copy.
  EXPECT_EQ(xx.select(2, 1).to_floats(), x.select(2, 1).to_floats());
}

TEST_F(Xla, ConversionsRoundAsTorch) {
  // Ties, subnormals, overflow and NaN for bf16, f16 and the f8 formats: bit for bit.
  std::vector<float> v = {0.f,         -0.f,      1.f,    1.00390625f, 1.01171875f,
                          3.14159265f, -2.5e-3f,  1e-40f, 65519.f,     70000.f,
                          300.f,       449.f,     465.f,  1e6f,        -1e6f,
                          INFINITY,    -INFINITY, NAN,    57344.f,     61440.f};
  const Tensor x = Tensor::from_floats(v, {int64_t(v.size())});
  const Tensor xx = x.to(kXla);
  for (DType dt : {DType::bf16, DType::f16, DType::f8e4m3, DType::f8e5m2, DType::boolean}) {
    EXPECT_TRUE(test::bit_equal(astype(xx, dt).to(Device::cpu()), astype(x, dt))) << dtype_name(dt);
    // And back to f32.
    EXPECT_TRUE(test::bit_equal(astype(astype(xx, dt), DType::f32).to(Device::cpu()),
                                astype(astype(x, dt), DType::f32)))
        << dtype_name(dt);
  }
  const Tensor i = Tensor::from_ints({-3, 0, 7, 1 << 20}, {4});
  EXPECT_TRUE(
      test::bit_equal(astype(i.to(kXla), DType::f32).to(Device::cpu()), astype(i, DType::f32)));
  EXPECT_TRUE(test::bit_equal(add(i.to(kXla), i.to(kXla)).to(Device::cpu()), add(i, i)));
}

TEST_F(Xla, MatmulLinearSoftmaxReduce) {
  const Tensor a = seq({2, 5, 7}), b = seq({7, 3}, DType::f32, 0.21f);
  const Tensor w = seq({4, 7}, DType::f32, 0.05f), bias = seq({4}, DType::f32, 0.9f);
  const Tensor xa = a.to(kXla);
  EXPECT_TRUE(test::all_close(matmul(xa, b.to(kXla)).to(Device::cpu()), matmul(a, b), 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(linear(xa, w.to(kXla), bias.to(kXla)).to(Device::cpu()),
                              linear(a, w, bias), 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(softmax(xa, -1).to(Device::cpu()), softmax(a, -1), 1e-6, 1e-6));
  EXPECT_TRUE(test::all_close(var(xa, 1).to(Device::cpu()), var(a, 1), 1e-5, 1e-5));
  EXPECT_TRUE(test::bit_equal(argmax(xa, 2).to(Device::cpu()), argmax(a, 2)));
  const Tensor ab = astype(a, DType::bf16);
  EXPECT_TRUE(
      test::bf16_close(matmul(ab.to(kXla), astype(b, DType::bf16).to(kXla)).to(Device::cpu()),
                       matmul(ab, astype(b, DType::bf16))));
}

TEST_F(Xla, ErrorsAreOneLineNeverAnAbort) {
  std::string e = test::error_message([] { xla::PjrtClient("/nonexistent/plugin.so", "cpu"); });
  EXPECT_NE(e.find("[xla] cannot load the PJRT plugin /nonexistent/plugin.so"), std::string::npos)
      << e;
  e = test::error_message([] { xla::PjrtClient("libm.so.6", "cpu"); });
  EXPECT_NE(e.find("is not a PJRT plugin (no GetPjrtApi)"), std::string::npos) << e;
  // An op with no lowering, with the fallback switched off, names the op.
  setenv("TESSERA_XLA_FALLBACK", "0", 1);
  const Tensor x = seq({3});
  const Tensor xx = x.to(kXla);
  e = test::error_message([&] {
    (void)dispatch1(std::make_shared<Twice>(), {xx}, {{3}, DType::f32});
    synchronize(kXla);
  });
  unsetenv("TESSERA_XLA_FALLBACK");
  EXPECT_NE(e.find("[xla] no StableHLO lowering for twice_for_test on (f32)"), std::string::npos)
      << e;
  // With it on (the default), the CPU runs it on host copies and the stats say so.
  reset_xla_stats();
  const Tensor y = dispatch1(std::make_shared<Twice>(), {xx}, {{3}, DType::f32});
  EXPECT_TRUE(test::bit_equal(y.to(Device::cpu()), mul(x, 2.0)));
  EXPECT_EQ(xla_stats().fallbacks["twice_for_test"], 1);
}

// Every op family of the conformance suite runs on xla:cpu through its lowering: none falls
// back to the CPU (one eager run per case; the suite checks values in every mode). Run in the
// xla_conformance entry, after the suite has compiled these cases (tests/xla.cmake).
TEST_F(Xla, EveryConformanceFamilyIsLowered) {
  reset_xla_stats();
  for (size_t i = 0; i < std::size(conformance::kFamilies); ++i) {
    for (const conformance::Case& c : conformance::kFamilies[i].gen(conformance::family_seed(i))) {
      std::vector<Tensor> in;
      for (const Tensor& t : c.inputs) in.push_back(t.defined() ? t.to(kXla) : t);
      for (const Tensor& o : c.fn(in))
        if (o.defined()) (void)o.to(Device::cpu());
    }
  }
  const XlaStats st = xla_stats();
  std::string fell;
  for (const auto& [name, n] : st.fallbacks) fell += " " + name + " x" + std::to_string(n);
  EXPECT_TRUE(st.fallbacks.empty()) << "ran on the CPU:" << fell;
  std::printf("[xla] conformance cases: %lld compiles (%.1f s), %lld cache hits\n",
              (long long)st.compiles, st.compile_seconds, (long long)st.cache_hits);
}

// Buffer donation (decision 0050): a result that replaces a storage's bytes reuses its buffer;
// a buffer anything still references is never given away (reading it afterwards would fail).
TEST_F(Xla, InPlaceWriteDonatesTheStorageItReplaces) {
  Backend& be = backend_for(kXla);
  const Tensor a = seq({4}).to(kXla);
  for (bool donate : {true, false}) {
    SCOPED_TRACE(donate ? "donation on" : "donation off");
    set_xla_donation(donate);
    Tensor b = seq({16}, DType::f32, 0.21f).to(kXla);
    Tensor c = seq({4}, DType::f32, 0.05f).to(kXla);
    synchronize(kXla);
    reset_xla_stats();
    const int64_t live0 = xla_stats().live_bytes;
    // A part of b (dynamic_update_slice of its bytes) and the whole of c (only overwritten).
    Tensor part = b.slice(0, 4, 8);
    be.copy(a, part);
    be.copy(a, c);
    synchronize(kXla);
    const XlaStats st = xla_stats();
    EXPECT_EQ(st.donated_bytes, donate ? 64 + 16 : 0);
    // Donated: the results took the old buffers, so nothing more is held at any point.
    EXPECT_EQ(st.live_bytes, live0);
    if (donate) EXPECT_EQ(st.peak_bytes, live0);
    if (!donate) EXPECT_EQ(st.peak_bytes, live0 + 64);  // b's new bytes beside its old ones
    std::vector<float> want = seq({16}, DType::f32, 0.21f).to_floats();
    const std::vector<float> av = seq({4}).to_floats();
    for (int i = 0; i < 4; ++i) want[size_t(4 + i)] = av[size_t(i)];
    EXPECT_EQ(b.to(Device::cpu()).to_floats(), want);
    EXPECT_EQ(c.to(Device::cpu()).to_floats(), av);
    EXPECT_EQ(a.to(Device::cpu()).to_floats(), av);  // the source is read, never donated
  }
  set_xla_donation(true);
  // The plugin's own counter, where it has one (the CPU plugin: -1, hence xla_stats' bytes).
  std::printf("[xla] plugin bytes in use: %lld\n", (long long)xla_plugin_bytes_in_use(kXla));
}

TEST_F(Xla, SegmentDonatesOnlyInputsNothingElseHolds) {
  const EagerMode prev = eager_mode();
  set_eager_mode(EagerMode::DeferAndFuse);
  const std::vector<float> xv = seq({1024}).to_floats();
  std::vector<float> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) want[i] = (xv[i] * 2.f + 1.f) + xv[i];
  for (int held = 0; held < 3; ++held) {
    SCOPED_TRACE(held == 0 ? "dead input" : held == 1 ? "input held" : "a view held");
    Tensor x = seq({1024}).to(kXla);
    Tensor keep = held == 1 ? x : held == 2 ? x.slice(0, 0, 512) : Tensor();
    Tensor y = add(add(mul(x, 2.0), 1.0), x);  // x read twice: one parameter
    x = Tensor();  // the recorded ops hold the only other references
    reset_xla_stats();
    const std::vector<float> got = y.to(Device::cpu()).to_floats();
    EXPECT_EQ(got, want);
    EXPECT_EQ(xla_stats().donated_bytes, held == 0 ? 4096 : 0);
    if (held == 1) EXPECT_EQ(keep.to(Device::cpu()).to_floats(), xv);
    if (held == 2)
      EXPECT_EQ(keep.to(Device::cpu()).to_floats(),
                std::vector<float>(xv.begin(), xv.begin() + 512));
  }
  set_eager_mode(prev);
}

// Donation in the FLUX.1 pipeline on xla:cpu: the same latents and image with and without it;
// in deferred mode the segments' dead inputs (the previous latents, activations between
// segments) give their buffers to results, and the peak of device bytes never rises.
TEST_F(Xla, PipelineDonationKeepsResultsNeverRaisesThePeak) {
  const std::string model = "flux1-schnell-tiny";
  FluxCallOptions call;
  call.prompt = {"a cat"};
  call.height = 64;
  call.width = 64;
  call.num_inference_steps = 4;
  call.seed = 0;
  auto pipe = FluxPipeline::from_pretrained(test::fixture_path(model), {.device = kXla});
  for (EagerMode mode : {EagerMode::DeferNever, EagerMode::DeferAndFuse}) {
    const bool defer = mode == EagerMode::DeferAndFuse;
    SCOPED_TRACE(defer ? "deferred" : "eager");
    const EagerMode prev = eager_mode();
    set_eager_mode(mode);
    XlaStats st[2];
    int64_t above[2] = {};  // peak over steps 1..3 above the bytes held after step 0
    std::vector<Tensor> latents[2];
    PipelineOutput out[2];
    for (int on = 0; on < 2; ++on) {
      set_xla_donation(on == 1);
      int64_t base = 0;
      call.on_step_end = [&](int i, int n, const Tensor& l) {
        latents[on].push_back(l.to(Device::cpu()));
        if (i == 0) {
          reset_xla_stats();
          base = xla_stats().live_bytes;
        }
        if (i == n - 1) {
          st[on] = xla_stats();
          above[on] = st[on].peak_bytes - base;
        }
      };
      (*pipe)(call);  // compiles this mode's executables (with or without aliases)
      latents[on].clear();
      out[on] = (*pipe)(call);
    }
    set_xla_donation(true);
    set_eager_mode(prev);
    ASSERT_EQ(latents[0].size(), latents[1].size());
    for (size_t i = 0; i < latents[0].size(); ++i)
      EXPECT_TRUE(test::bit_equal(latents[0][i], latents[1][i])) << "step " << i;
    EXPECT_TRUE(test::bit_equal(out[0].image, out[1].image));
    EXPECT_EQ(st[0].donated_bytes, 0);
    if (defer) EXPECT_GT(st[1].donated_bytes, 0);  // the previous latents, dead activations
    EXPECT_LE(above[1], above[0]);
    std::printf("[xla donation] %s, denoising steps 1-3: peak device bytes above the held ones "
                "%lld without donation, %lld with (%lld bytes donated)\n",
                defer ? "deferred" : "eager", (long long)above[0], (long long)above[1],
                (long long)st[1].donated_bytes);
  }
}

// Model offload onto xla:cpu (the seed's pipe.enable_model_cpu_offload() on an XLA device):
// each model's weights are uploaded for its stage and freed after it, and the images are the
// same as with every model moved to the device.
TEST_F(Xla, ModelOffloadUploadsEachModelForItsStageOnly) {
  const std::string model = "flux1-schnell-tiny";
  std::ifstream idx(test::fixture_path("goldens/" + model + "/index.json"));
  if (!idx) GTEST_SKIP() << "missing pipeline goldens";
  const std::string name = nlohmann::json::parse(idx)["cases"][0];
  const std::string dir = "goldens/" + model + "/pipeline/" + name + "/f32/";
  std::ifstream in(test::fixture_path(dir + "manifest.json"));
  const auto m = nlohmann::json::parse(in);
  const auto golden = test::load_fixture(dir + "tensors.safetensors");
  FluxCallOptions call = test::call_from_manifest<FluxCallOptions>(m);
  Allocator& dev = backend_for(kXla).allocator(kXla);  // bytes of storages on xla:cpu

  auto full = FluxPipeline::from_pretrained(test::fixture_path(model), {.device = kXla});
  const int64_t clip = full->text_encoder->parameter_bytes(),
                t5 = full->text_encoder_2->parameter_bytes(),
                dit = full->transformer->parameter_bytes(), vae = full->vae->parameter_bytes();
  const int64_t smallest = std::min(std::min(clip, t5), std::min(dit, vae));
  EXPECT_GE(dev.stats().current_bytes, clip + t5 + dit + vae);  // pipe.to(device): all at once
  std::vector<Tensor> base_latents;
  call.on_step_end = [&](int, int, const Tensor& l) { base_latents.push_back(l.to(Device::cpu())); };
  const PipelineOutput base = (*full)(call);
  full.reset();

  const int64_t before = dev.stats().current_bytes;
  EXPECT_LT(before, smallest);
  auto pipe = FluxPipeline::from_pretrained(
      test::fixture_path(model), {.device = kXla, .offload = OffloadMode::model});
  EXPECT_EQ(pipe->execution_device(), kXla);
  EXPECT_LT(dev.stats().current_bytes - before, smallest);  // loading leaves nothing there
  // The text encoders' stage: both uploaded, both freed when it ends.
  dev.reset_peak();
  pipe->encode_prompt(call.prompt, call.prompt, 1, call.max_sequence_length);
  EXPECT_GE(dev.stats().peak_bytes - before, std::max(clip, t5));
  EXPECT_LT(dev.stats().current_bytes - before, smallest);

  std::vector<Tensor> latents;
  std::vector<int64_t> during;  // device bytes after each step: the transformer and the latents
  call.on_step_end = [&](int, int, const Tensor& l) {
    latents.push_back(l.to(Device::cpu()));
    during.push_back(dev.stats().current_bytes - before);
  };
  reset_xla_stats();
  const PipelineOutput out = (*pipe)(call);
  ASSERT_EQ(latents.size(), base_latents.size());
  for (size_t i = 0; i < latents.size(); ++i) {
    EXPECT_TRUE(test::bit_equal(latents[i], base_latents[i])) << "step " << i;
    EXPECT_TRUE(test::activations_close(latents[i], golden.at("latents." + std::to_string(i)),
                                        DType::f32))
        << "step " << i;
    EXPECT_GE(during[i], dit);
    EXPECT_LT(during[i], dit + smallest);  // text encoders gone, VAE not there yet
  }
  EXPECT_TRUE(test::bit_equal(out.image, base.image));
  EXPECT_EQ(out.images[0].pixels, base.images[0].pixels);
  EXPECT_LT(dev.stats().current_bytes - before, smallest);  // the VAE freed after decoding
  EXPECT_TRUE(xla_stats().fallbacks.empty());
  std::printf("[xla offload] weights: clip %lld, t5 %lld, transformer %lld, vae %lld bytes; on "
              "the device after step 0: %lld, after the run: %lld\n",
              (long long)clip, (long long)t5, (long long)dit, (long long)vae,
              (long long)during[0], (long long)(dev.stats().current_bytes - before));
}

// The FLUX.1 transformer on xla:cpu against diffusers' goldens (module.to(device)).
TEST_F(Xla, FluxTransformerMatchesDiffusers) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    test::ComponentGolden g;
    if (!test::load_component_golden("flux1-schnell-tiny", "transformer", dt, &g))
      GTEST_SKIP() << "missing transformer golden";
    auto model = FluxTransformer2DModel::from_pretrained(
        test::fixture_path("flux1-schnell-tiny/transformer"), dt);
    model->to(kXla);
    auto get = [&](const char* name) {
      auto it = g.inputs.find(name);
      return it == g.inputs.end() ? Tensor() : it->second.to(kXla);
    };
    reset_xla_stats();
    const Tensor sample = model->forward({get("hidden_states"), get("encoder_hidden_states"),
                                          get("pooled_projections"), get("timestep"),
                                          get("img_ids"), get("txt_ids"), get("guidance")});
    EXPECT_EQ(sample.device(), kXla);
    test::expect_all_match(g.outputs, {{"sample", sample.to(Device::cpu())}}, dt, "output");
    EXPECT_TRUE(xla_stats().fallbacks.empty());
    const FluxTransformerInputs in{get("hidden_states"),
                                   get("encoder_hidden_states"),
                                   get("pooled_projections"),
                                   get("timestep"),
                                   get("img_ids"),
                                   get("txt_ids"),
                                   get("guidance")};
    // Deferred: segments as executables; compiled: the whole forward as one executable.
    set_eager_mode(EagerMode::DeferAndFuse);
    const Tensor deferred = model->forward(in);
    synchronize(kXla);
    set_eager_mode(EagerMode::DeferNever);
    test::expect_all_match(g.outputs, {{"sample", deferred.to(Device::cpu())}}, dt, "deferred");
    CompileOptions copt;
    copt.backend = "xla";
    model->compile(copt);
    const Tensor compiled = model->forward(in);
    test::expect_all_match(g.outputs, {{"sample", compiled.to(Device::cpu())}}, dt, "compiled");
    EXPECT_GE(xla_stats().graph_compiles, 2);
    EXPECT_TRUE(xla_stats().fallbacks.empty());
    // Regional: one executable per repeated block class (double, single), each block's weights
    // as its inputs; the second forward compiles nothing.
    model->reset_compile();
    model->compile_repeated_blocks(copt);
    const int64_t blocks = int64_t(model->repeated_block_modules().size());
    for (int pass = 0; pass < 2; ++pass) {
      reset_xla_stats();
      const Tensor regional = model->forward(in);
      test::expect_all_match(g.outputs, {{"sample", regional.to(Device::cpu())}}, dt, "regional");
      const XlaStats rs = xla_stats();
      EXPECT_EQ(rs.graph_compiles, pass == 0 ? 2 : 0) << "pass " << pass;
      EXPECT_EQ(rs.graph_runs, blocks);
      EXPECT_TRUE(rs.fallbacks.empty());
    }
    const auto programs = model->compiled_programs();
    EXPECT_EQ(programs.size(), 2u);
    for (const auto& [cls, n] : programs) EXPECT_EQ(n, 1) << cls;
    model->reset_compile();
  }
}

}  // namespace
}  // namespace tessera
#endif  // TESSERA_HAS_XLA
