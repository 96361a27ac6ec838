// Backend conformance harness (issue 18 part 6, after ggml's test-backend-ops): a Case is a
// function of host tensors; run_case() evaluates it on the CPU in strict eager (the reference)
// and on every available device in every execution mode, and compares.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ops/copy.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/primitive.h"
#include "runtime/random.h"
#include "runtime/tensor.h"
#include "test_util.h"

namespace tessera::conformance {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// How an input reaches the op. Views are made inside the case's function, so deferred and
// compiled modes record (or trace) them too: a compiled program binds its inputs contiguous,
// so a view made outside would never reach the kernel as a view.
enum class View : uint8_t {
  contiguous,
  transposed,  // the last two dims swapped in memory (ndim >= 2)
  strided,     // every other row of dim 0, starting one row in
  offset,      // a window of the last dim, 3 elements into longer rows
  broadcast,   // dim 0 expanded from 1 (stride 0)
  permuted,    // dims stored in reverse order
};

inline const char* view_name(View v) {
  switch (v) {
    case View::contiguous:
      return "contig";
    case View::transposed:
      return "transposed";
    case View::strided:
      return "strided";
    case View::offset:
      return "offset";
    case View::broadcast:
      return "bcast";
    case View::permuted:
      return "permuted";
  }
  return "?";
}

enum class Values : uint8_t {
  normal,    // randn
  edges,     // randn with a quarter replaced by 0, -0, +-inf, NaN, denormals, huge, tiny
  positive,  // |randn| + 0.1
  ints,      // integers in [-40, 40]
  ids,       // integers in [0, range)
  mask,      // 0/1 (the boolean dtype or any other)
};

struct Case {
  std::string name;
  std::set<std::string> covers;  // "fn:NAME", "prim:NAME", "enum:Type::value"
  std::vector<Tensor> inputs;    // host, contiguous
  Fn fn;
  // Non-CPU devices: multiplies the dtype tolerance (long accumulations); 0 = bit-exact there
  // too (data movement, integer results).
  double tol_scale = 1.0;
  // Modes skipped because of a reported bug (mode -> why); TESSERA_CONFORMANCE_KNOWN_BUGS=1
  // runs them anyway. Each skip is printed, so it stays visible.
  std::map<std::string, std::string> known_bugs;
};

inline std::string shape_of(const Shape& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "x" : "") + std::to_string(s[i]);
  return r.empty() ? "scalar" : r;
}

// Builds one case: arg() makes a seeded input and remembers how to view it.
class Builder {
 public:
  Builder(std::string name, uint64_t seed) : name_(std::move(name)), gen_(seed) {}

  int64_t pick(int64_t n) { return int64_t(gen_.random() % uint64_t(n)); }
  template <typename T>
  T pick(std::initializer_list<T> v) {
    return *(v.begin() + pick(int64_t(v.size())));
  }
  bool coin() { return pick(2) == 1; }
  // Appends attributes to the case's name (what a repro needs besides the inputs).
  void note(const std::string& s) { name_ += " " + s; }

  // An input of logical shape `shape` seen through `view`; returns its index.
  int arg(const Shape& shape, DType dt, View view = View::contiguous,
          Values values = Values::normal, int64_t range = 0) {
    if (shape.size() < 2 && (view == View::transposed || view == View::permuted))
      view = View::contiguous;
    if (shape.empty() && view != View::contiguous) view = View::contiguous;
    Shape base = shape;
    switch (view) {
      case View::contiguous:
        break;
      case View::transposed:
        std::swap(base[base.size() - 1], base[base.size() - 2]);
        break;
      case View::strided:
        base[0] = 2 * shape[0] + 1;
        break;
      case View::offset:
        base.back() = shape.back() + 5;
        break;
      case View::broadcast:
        base[0] = 1;
        break;
      case View::permuted:
        base.assign(shape.rbegin(), shape.rend());
        break;
    }
    inputs_.push_back(make(base, dt, values, range));
    views_.push_back(view);
    shapes_.push_back(shape);
    name_ += " " + std::string(dtype_name(dt)) + "[" + shape_of(shape) +
             (view == View::contiguous ? "" : std::string(" ") + view_name(view)) + "]";
    return int(inputs_.size()) - 1;
  }

  Case build(std::set<std::string> covers, Fn body, double tol_scale = 1.0) {
    Case c;
    c.name = name_;
    c.covers = std::move(covers);
    c.inputs = inputs_;
    c.tol_scale = tol_scale;
    c.fn = [views = views_, shapes = shapes_,
            body = std::move(body)](const std::vector<Tensor>& in) {
      std::vector<Tensor> v(in.size());
      for (size_t i = 0; i < in.size(); ++i) v[i] = apply_view(in[i], views[i], shapes[i]);
      return body(v);
    };
    return c;
  }

  std::vector<float> floats(int64_t n, Values values, int64_t range = 0) {
    std::vector<float> out(size_t(n), 0.f);
    if (values == Values::ints || values == Values::ids || values == Values::mask) {
      for (auto& v : out) {
        if (values == Values::ints) v = float(pick(81) - 40);
        if (values == Values::ids) v = float(pick(std::max<int64_t>(range, 1)));
        if (values == Values::mask) v = float(pick(2));
      }
      return out;
    }
    if (n > 0) out = randn({n}, DType::f32, gen_).to_floats();
    if (values == Values::positive)
      for (auto& v : out) v = std::fabs(v) + 0.1f;
    if (values == Values::edges) {
      const float inf = std::numeric_limits<float>::infinity();
      static const float kEdges[] = {0.f,     -0.f,  inf,    -inf,    std::nanf(""), 1e-40f,
                                     -1e-40f, 3e38f, -3e38f, 65504.f, 1e-8f,         88.7f,
                                     -104.f,  20.f,  -20.f,  0.5f,    -1.f,          1.f};
      for (auto& v : out)
        if (pick(4) == 0) v = kEdges[pick(int64_t(std::size(kEdges)))];
    }
    return out;
  }

 private:
  Tensor make(const Shape& base, DType dt, Values values, int64_t range) {
    const std::vector<float> f = floats(shape_numel(base), values, range);
    if (dt == DType::i64 || dt == DType::i32 || dt == DType::boolean) {
      std::vector<int64_t> iv(f.size());
      for (size_t i = 0; i < f.size(); ++i) iv[i] = int64_t(f[i]);
      return Tensor::from_ints(iv, base, dt);
    }
    return Tensor::from_floats(f, base, dt);
  }

  static Tensor apply_view(const Tensor& t, View view, const Shape& shape) {
    switch (view) {
      case View::contiguous:
        return t;
      case View::transposed:
        return t.transpose(-1, -2);
      case View::strided:
        return t.slice(0, 1, 2 * shape[0] + 1, 2);
      case View::offset:
        return t.slice(-1, 3, 3 + shape.back());
      case View::broadcast:
        return t.expand(shape);
      case View::permuted: {
        std::vector<int64_t> dims(shape.size());
        for (size_t i = 0; i < dims.size(); ++i) dims[i] = int64_t(dims.size() - 1 - i);
        return t.permute(dims);
      }
    }
    return t;
  }

  std::string name_;
  Generator gen_;
  std::vector<Tensor> inputs_;
  std::vector<View> views_;
  std::vector<Shape> shapes_;
};

// Sizes that end vector loops early or late: 1, widths +-1 of 8/16 lanes, primes.
inline int64_t odd_size(Builder& b, int64_t max_size = 33) {
  static const int64_t kSizes[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64, 65};
  int64_t s;
  do s = kSizes[b.pick(int64_t(std::size(kSizes)))];
  while (s > max_size);
  return s;
}
inline Shape odd_shape(Builder& b, int ndim, int64_t max_size = 33) {
  Shape s(static_cast<size_t>(ndim));
  for (auto& d : s) d = odd_size(b, max_size);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Running and comparing.

// Host tensors onto `d` and back, through the backends' copies (runtime/backend.h).
inline Tensor to_device(const Tensor& t, const Device& d) {
  return t.defined() ? t.to(d) : t;
}
inline Tensor to_host(const Tensor& t) {
  return t.defined() ? t.to(Device::cpu()) : t;
}

// Materialised contiguous host copies (in strict eager, so clone is not recorded).
inline std::vector<Tensor> settle(const std::vector<Tensor>& outs) {
  std::vector<Tensor> r;
  for (const Tensor& t : outs) r.push_back(t.defined() ? clone(to_host(t)) : Tensor());
  return r;
}

struct Tolerance {
  double rtol, atol;
};
// Non-CPU devices: per output dtype, scaled by the case (0: exact).
inline Tolerance device_tolerance(DType dt, double scale) {
  switch (dt) {
    case DType::f32:
      return {1e-5 * scale, 1e-5 * scale};
    case DType::bf16:
      return {1.6e-2 * scale, 1e-2 * scale};
    case DType::f16:
      return {2e-3 * scale, 1e-3 * scale};
    default:
      return {0, 0};  // integers, bool, f8 (a conversion is exact or a bug)
  }
}

inline ::testing::AssertionResult close_enough(const Tensor& got, const Tensor& ref,
                                               Tolerance tol) {
  if (tol.rtol == 0 && tol.atol == 0) return test::bit_equal(got, ref);
  if (got.shape() != ref.shape() || got.dtype() != ref.dtype())
    return ::testing::AssertionFailure()
           << "got " << got.describe() << ", expected " << ref.describe();
  const auto a = got.to_floats(), e = ref.to_floats();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool an = std::isnan(a[i]), en = std::isnan(e[i]);
    const bool ok = (an && en) || (!an && !en &&
                                   (a[i] == e[i] || std::fabs(double(a[i]) - double(e[i])) <=
                                                        tol.atol + tol.rtol * std::fabs(e[i])));
    if (!ok)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << e[i]
                                           << " (rtol " << tol.rtol << ", atol " << tol.atol << ")";
  }
  return ::testing::AssertionSuccess();
}

// Restores the process-wide mode switches whatever a case throws.
struct ModeGuard {
  EagerMode mode = eager_mode();
  ~ModeGuard() {
    set_eager_mode(mode);
    set_async_dispatch(false);
  }
};

inline std::vector<std::string> modes_for(const Device& d) {
  // On the CPU, strict eager is the reference itself; its asynchronous stream is the variant.
  if (d == Device::cpu())
    return {"eager-async", "defer", "defer-replay", "compile", "compile-replay"};
  return {"eager", "defer", "defer-replay", "compile", "compile-replay"};
}

// Outputs of `c` on `d` in each mode of modes_for(d), as host tensors.
inline std::vector<std::pair<std::string, std::vector<Tensor>>> run_modes(const Case& c,
                                                                          const Device& d) {
  ModeGuard guard;
  std::vector<Tensor> in;
  for (const Tensor& t : c.inputs) in.push_back(to_device(t, d));
  std::vector<std::pair<std::string, std::vector<Tensor>>> r;
  for (const std::string& m : modes_for(d)) {
    // TESSERA_CONFORMANCE_VERBOSE=1 names each run before it starts (a crash names its case).
    if (std::getenv("TESSERA_CONFORMANCE_VERBOSE"))
      std::fprintf(stderr, "[conformance] %s on %s: %s\n", c.name.c_str(), d.str().c_str(),
                   m.c_str());
    if (auto it = c.known_bugs.find(m);
        it != c.known_bugs.end() && !std::getenv("TESSERA_CONFORMANCE_KNOWN_BUGS")) {
      std::printf("[conformance] KNOWN BUG, %s skipped for %s: %s\n", m.c_str(), c.name.c_str(),
                  it->second.c_str());
      continue;
    }
    std::vector<Tensor> out;
    if (m == "eager" || m == "eager-async") {
      set_eager_mode(EagerMode::DeferNever);
      if (m == "eager-async") set_async_dispatch(true);
      out = c.fn(in);
      synchronize(d);
      set_async_dispatch(false);
      out = settle(out);
    } else if (m == "defer" || m == "defer-replay") {
      // The second run finds the first one's segment cached and replays it.
      set_eager_mode(EagerMode::DeferAndFuse);
      out = c.fn(in);
      synchronize(d);
      set_eager_mode(EagerMode::DeferNever);
      out = settle(out);
    } else if (m == "compile") {
      CompileOptions o;
      o.backend = backend_for(d).name();
      CompiledFunction f("conformance", o);
      set_eager_mode(EagerMode::DeferNever);
      out = settle(f(in, c.fn));
      // Fresh input storages: the stored program binds them without running the C++.
      std::vector<Tensor> in2;
      for (const Tensor& t : c.inputs) in2.push_back(to_device(clone(t), d));
      std::vector<Tensor> again = settle(f(in2, c.fn));
      EXPECT_EQ(f.compiles(), 1) << c.name;
      EXPECT_EQ(f.cache_hits(), 1) << c.name;
      r.emplace_back(m, out);
      r.emplace_back("compile-replay", again);
      continue;
    } else {
      continue;  // compile-replay is made with compile
    }
    r.emplace_back(m, out);
  }
  return r;
}

// Every available device, every mode, against the CPU's strict eager: bitwise on the CPU
// (decisions 0009/0010: deferred and compiled modes keep every rounding point), the dtype
// tolerance elsewhere, or bitwise there too when `bitwise` (a backend running the CPU kernels).
inline void run_case(const Case& c, const std::vector<Device>& devices, bool bitwise = false) {
  SCOPED_TRACE(c.name);
  std::vector<Tensor> ref;
  {
    ModeGuard guard;
    set_eager_mode(EagerMode::DeferNever);
    set_async_dispatch(false);
    ref = settle(c.fn(c.inputs));
  }
  for (const Device& d : devices) {
    std::vector<std::pair<std::string, std::vector<Tensor>>> results;
    try {
      results = run_modes(c, d);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " on " << d.str() << " threw: " << e.what();
      continue;
    }
    for (const auto& [mode, out] : results) {
      if (out.size() != ref.size()) {
        ADD_FAILURE() << c.name << " on " << d.str() << " " << mode << ": " << out.size()
                      << " outputs, expected " << ref.size();
        continue;
      }
      for (size_t i = 0; i < ref.size(); ++i) {
        if (!ref[i].defined()) {
          EXPECT_FALSE(out[i].defined());
          continue;
        }
        const Tolerance tol = d == Device::cpu() || bitwise
                                  ? Tolerance{0, 0}
                                  : device_tolerance(ref[i].dtype(), c.tol_scale);
        EXPECT_TRUE(close_enough(out[i], ref[i], tol))
            << c.name << " on " << d.str() << " in mode " << mode << ", output " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Shared by the case generators (conformance_elementwise_cases.cpp, conformance_op_cases.cpp).

using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;
using Covers = std::set<std::string>;

inline View any_view(Builder& b) {
  return b.pick({View::contiguous, View::contiguous, View::transposed, View::strided, View::offset,
                 View::broadcast, View::permuted});
}
inline DType float_dtype(Builder& b) {
  return b.pick({DType::f32, DType::bf16, DType::f16});
}
inline DType mm_dtype(Builder& b) {
  return b.pick({DType::f32, DType::bf16});
}
// The coverage name of an op enum value ("enum:UnaryOp::silu").
inline std::string e(const char* type, const char* value) {
  return std::string("enum:") + type + "::" + value;
}

// One generator per op family: seeded cases for every op of the family.
std::vector<Case> binary_cases(uint64_t seed);
std::vector<Case> binary_scalar_cases(uint64_t seed);
std::vector<Case> unary_cases(uint64_t seed);
std::vector<Case> glu_cases(uint64_t seed);
std::vector<Case> where_cases(uint64_t seed);
std::vector<Case> copy_cases(uint64_t seed);
std::vector<Case> chain_cases(uint64_t seed);
std::vector<Case> matmul_cases(uint64_t seed);
std::vector<Case> conv_cases(uint64_t seed);
std::vector<Case> attention_cases(uint64_t seed);
std::vector<Case> softmax_cases(uint64_t seed);
std::vector<Case> norm_cases(uint64_t seed);
std::vector<Case> rope_cases(uint64_t seed);
std::vector<Case> reduce_cases(uint64_t seed);
std::vector<Case> embedding_cases(uint64_t seed);
std::vector<Case> shape_cases(uint64_t seed);
std::vector<Case> resample_cases(uint64_t seed);

// The families, each with its seed (backend_conformance_test.cpp, backend_standin_test.cpp).
struct Family {
  const char* name;
  std::vector<Case> (*gen)(uint64_t);
};
inline constexpr Family kFamilies[] = {
    {"Binary", binary_cases},       {"BinaryScalar", binary_scalar_cases},
    {"Unary", unary_cases},         {"Glu", glu_cases},
    {"Where", where_cases},         {"CopyAstype", copy_cases},
    {"Matmul", matmul_cases},       {"Conv2d", conv_cases},
    {"Attention", attention_cases}, {"Softmax", softmax_cases},
    {"Norm", norm_cases},           {"Rope", rope_cases},
    {"Reduce", reduce_cases},       {"Embedding", embedding_cases},
    {"ShapeOps", shape_cases},      {"Resample", resample_cases},
    {"FusedChains", chain_cases},
};

inline uint64_t base_seed() {
  const char* s = std::getenv("TESSERA_CONFORMANCE_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261218ull;
}
inline uint64_t family_seed(size_t i) {
  return base_seed() + 100000 * (i + 1);
}

}  // namespace tessera::conformance
