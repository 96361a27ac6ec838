// Module: a tree of named parameters that mirrors the diffusers/transformers module it
// implements, so a checkpoint key ("transformer_blocks.0.attn.to_q.weight") maps to a member by
// its path. Forward functions live in the subclasses and only call ops.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/tensor_parallel.h"
#include "runtime/compile.h"
#include "runtime/tensor.h"

namespace tessera {

// Where weights come from: a checkpoint (one file, or shards through an index) or a test map.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  // Zero-copy when possible. Throws when absent.
  virtual Tensor get(const std::string& name) const = 0;
  // Names every tensor in the source (to report unexpected keys).
  virtual std::vector<std::string> names() const = 0;
  // For error messages: the checkpoint path or folder.
  virtual std::string describe() const = 0;
};

struct LoadOptions {
  DType dtype = DType::f32;       // parameters are converted to this (zero-copy when equal)
  bool allow_unused = true;       // checkpoint tensors no parameter asks for
  std::string prefix;             // prepended to every parameter name ("model.")
};

class Module;

// Sees every parameter load_weights fills (model offload records where each one came from, to
// materialise it again later). Installed per thread by set_load_observer.
class LoadObserver {
 public:
  virtual ~LoadObserver() = default;
  virtual void loaded(Tensor* slot, const Tensor& source, DType dtype) = 0;
};
// Returns the previous observer; nullptr uninstalls.
LoadObserver* set_load_observer(LoadObserver* observer);

// Called around a module's call(): sequential offload sets one on each repeated block to
// materialise its weights before and release them after (block programs read the slots between).
class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  virtual void pre_forward(const Module& module) = 0;
  virtual void post_forward(const Module& module) = 0;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  struct Parameter {
    std::string name;  // full dotted path
    Tensor* slot;
    Shape shape;       // expected shape from the config (this rank's slice when sharded)
    bool optional;     // may be missing from the checkpoint (then stays undefined)
    ShardSpec shard;   // tensor parallelism: the slice of the checkpoint tensor this rank keeps
    Shape full_shape;  // the checkpoint tensor's shape (= shape when not sharded)
    ShardSpec split;   // SPMD (decision 0060): whole, but stored split over an XLA device's mesh
  };
  // Every parameter below this module, with full dotted names.
  std::vector<Parameter> named_parameters(const std::string& prefix = "") const;
  // Every descendant module with its dotted path ("transformer_blocks.0.attn.to_q"), parents
  // before children.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  int64_t parameter_count() const;
  int64_t parameter_bytes() const;
  // Moves every parameter onto `device` (torch's module.to(device)): a copy through the two
  // backends' host copies; a parameter already there stays as it is. A parameter with an SPMD
  // split goes onto an XLA device split over its mesh (to_sharded), each device its piece.
  void to(const Device& device);

  // Fills every parameter from `source`, checking shapes against the config. Errors name the
  // tensor, the source and both shapes. A sharded parameter reads only its slice (read_shard).
  // Returns the checkpoint tensors nothing asked for.
  std::vector<std::string> load_weights(const WeightSource& source, const LoadOptions& opt);
  // Drops every parameter (they are reloaded by load_weights; used by model offload).
  void release_weights();

  // Compiled mode (runtime/compile.h): this module's forward runs as one program per input
  // signature, parameters captured as constants. Only modules whose forward routes through
  // call() are affected.
  void compile(const CompileOptions& options = {});
  // Regional compilation: each descendant whose class_name() is in repeated_blocks() runs
  // through one program per class and signature, with its parameters as program inputs, so
  // every layer of a class shares it (and weights may change between calls, as under offload).
  void compile_repeated_blocks(const CompileOptions& options = {});
  // Back to eager: forgets compile() and compile_repeated_blocks() on this tree.
  void reset_compile();
  // Programs of this tree compiled for another backend are made anew for `backend` (same
  // whole/regional choice): a model moved to an XLA device runs its programs there.
  void set_compile_backend(const std::string& backend);
  // diffusers' _repeated_blocks: the block classes regional compilation compiles.
  virtual std::vector<std::string> repeated_blocks() const { return {}; }
  // The descendants whose class is in repeated_blocks(), in registration (execution) order;
  // what regional compilation compiles and sequential offload streams.
  std::vector<Module*> repeated_block_modules();
  // The class name without namespaces ("FluxTransformerBlock").
  virtual std::string class_name() const;
  // Programs built per compiled function in this tree (its name: the class), for tests/reports.
  std::map<std::string, int64_t> compiled_programs() const;
  const std::shared_ptr<CompiledFunction>& compiled_function() const { return compiled_; }
  // compile() (not compile_repeated_blocks) was called here: the whole forward is one program.
  bool compiled_whole() const { return compiled_ && !compiled_->regional(); }

  void set_forward_hook(std::shared_ptr<ForwardHook> hook) { hook_ = std::move(hook); }
  ForwardHook* forward_hook() const { return hook_.get(); }

 protected:
  // Registers a parameter slot owned by this module; `shape` is what the config implies.
  void register_parameter(const std::string& name, Tensor* slot, Shape shape,
                          bool optional = false);
  // Tensor parallelism: this module's parameter `name` keeps only the slice `shard` of the
  // checkpoint tensor (its expected shape becomes the slice's).
  void shard_parameter(const std::string& name, const ShardSpec& shard);
  // SPMD: parameter `name` keeps its whole shape; on an XLA device it is stored split by
  // `split` (index ignored) over the devices of the mesh (Module::to).
  void split_parameter(const std::string& name, const ShardSpec& split);
  // Parameter `name` split by `spec` as `tp` runs: this rank's slice with one process per rank
  // (shard_parameter, index = the rank), or whole and stored split under SPMD (split_parameter).
  void split_parameter_for(const TensorParallelConfig& tp, const std::string& name, ShardSpec spec);
  // Registers a child; its parameters appear as "<name>.<param>".
  void register_module(const std::string& name, Module* child);
  // Registers a list of children as "<name>.0", "<name>.1", ...
  template <typename T>
  void register_modules(const std::string& name, std::vector<std::unique_ptr<T>>& children) {
    for (size_t i = 0; i < children.size(); ++i)
      register_module(name + "." + std::to_string(i), children[i].get());
  }
  // A forward body: inputs to outputs, as plain tensor lists.
  using Body = CompiledFunction::Fn;
  // Runs `body` as this module's forward, with what was set on it from outside: the forward
  // hook around it (sequential offload streams weights), and the program of compile() /
  // compile_repeated_blocks() (regional: the parameters as extra program inputs) in place of
  // the call. `variant` tells apart calls with other output sets. Models route each repeated
  // block's forward and their own whole forward through this, and know nothing else of either.
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, const Body& body,
                           int64_t variant = 0) const;

 private:
  struct OwnParameter {
    std::string name;
    Tensor* slot;
    Shape shape;
    bool optional;
    ShardSpec shard;
    Shape full_shape;
    ShardSpec split;
  };
  std::vector<OwnParameter> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::shared_ptr<CompiledFunction> compiled_;  // set by compile / compile_repeated_blocks
  mutable std::vector<Tensor*> param_slots_;    // regional calls: every slot, in order
  std::shared_ptr<ForwardHook> hook_;

  std::vector<Tensor> run_program(const std::vector<Tensor>& inputs, const Body& body,
                                  int64_t variant) const;
};

// `base` under other names (checkpoints that older or newer libraries saved with different keys):
// `to_base` maps a parameter name to the name in `base`; `to_model` maps a name in `base` back,
// for the report of unused tensors.
class RenamedWeightSource final : public WeightSource {
 public:
  using Rename = std::function<std::string(const std::string&)>;
  RenamedWeightSource(const WeightSource& base, Rename to_base, Rename to_model)
      : base_(base), to_base_(std::move(to_base)), to_model_(std::move(to_model)) {}
  bool contains(const std::string& name) const override { return base_.contains(to_base_(name)); }
  Tensor get(const std::string& name) const override { return base_.get(to_base_(name)); }
  std::vector<std::string> names() const override;
  std::string describe() const override { return base_.describe(); }

 private:
  const WeightSource& base_;
  Rename to_base_, to_model_;
};

// A WeightSource over an in-memory map (tests, converted weights).
class MapWeightSource final : public WeightSource {
 public:
  explicit MapWeightSource(std::map<std::string, Tensor> tensors, std::string what = "tensors")
      : tensors_(std::move(tensors)), what_(std::move(what)) {}
  bool contains(const std::string& name) const override { return tensors_.count(name) > 0; }
  Tensor get(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::string describe() const override { return what_; }

 private:
  std::map<std::string, Tensor> tensors_;
  std::string what_;
};

}  // namespace tessera
