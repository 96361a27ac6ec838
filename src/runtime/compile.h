// Compiled mode: a function of tensors is traced once per input signature (shapes, dtypes,
// device of every input) into a static program: fusion (runtime/fusion.h), a memory plan that
// reuses buffers by liveness, weights prepacked by the first run. Later calls with the same
// signature bind their inputs and run the stored program without running the function's C++.
// See docs/decisions/0010-compiled-mode.md.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessera {

struct CompileOptions {
  std::string backend = "cpu";
  bool fullgraph = true;  // a graph break (host read of a traced tensor) is an error
  bool dynamic = false;   // true is refused: static shapes only, one program per shape
};

// Checks the options; throws "[compile] ..." for what is not supported.
void validate_compile_options(const CompileOptions& options);

class CompiledProgram;  // compile.cpp

// A cache of programs for one function, keyed by the input signature (and a variant number the
// caller uses for different output sets, e.g. with captured activations).
class CompiledFunction {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  // `name` labels errors and the disk cache; `regional`: the programs are per repeated block.
  CompiledFunction(std::string name, CompileOptions options, bool regional = false);
  ~CompiledFunction();

  // Runs `fn` on `inputs` through the program for their signature, tracing it on a miss.
  // Undefined inputs are allowed (they stay undefined). Inside another trace, `fn` is traced
  // inline (the outer program contains it).
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs, const Fn& fn,
                                 int64_t variant = 0);

  const std::string& name() const { return name_; }
  const CompileOptions& options() const { return options_; }
  bool regional() const { return regional_; }
  int64_t num_programs() const;  // signatures compiled so far
  int64_t compiles() const;      // programs built by this function
  int64_t cache_hits() const;    // calls that reused a program
  void clear();                  // forgets every program (in memory only)

 private:
  std::string name_;
  CompileOptions options_;
  bool regional_;
  mutable std::mutex mu_;
  std::map<std::vector<int64_t>, std::shared_ptr<CompiledProgram>> programs_;
  int64_t compiles_ = 0, cache_hits_ = 0;
};

// The on-disk plan cache (TESSERA_CACHE_DIR, read at first use): each program's plan (fusion
// grouping and memory plan) stored under its structural fingerprint, so a second process skips
// planning. "" turns it off.
void set_compile_cache_dir(const std::string& dir);
std::string compile_cache_dir();

// Bit-identical programs can be bisected: fusion off in programs planned from now on.
void set_compile_fusion_enabled(bool on);

}  // namespace tessera
