// A small emitter of StableHLO text (MLIR generic op syntax inside one func.func @main). The
// XLA backend builds one module per op, per recorded segment or per traced program with it;
// text keeps the lowerings readable and a bad module comes back with the MLIR diagnostic.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace tessera::xla {

// An SSA value: its name ("%3"), shape and MLIR element type ("f32", "bf16", "i1", "ui8").
struct Val {
  std::string id;
  Shape shape;
  std::string et;
};

// MLIR element type of a tessera dtype (bool is i1 in programs; storage bytes are ui8).
const char* element_type(DType t);
std::string tensor_type(const Shape& shape, const std::string& et);  // "tensor<2x3xf32>"

class Hlo {
 public:
  Val param(const Shape& shape, const std::string& et);
  // Any op: "stablehlo.<name>"(args) {attrs} : (arg types) -> result type.
  Val op(const std::string& name, const std::vector<Val>& args, const std::string& attrs,
         const Shape& shape, const std::string& et);

  Val constant(double v, const std::string& et);                             // a scalar
  Val constant_vector(const std::vector<double>& v, const std::string& et);  // f32 or f64
  Val splat(double v, const Shape& shape, const std::string& et);            // a scalar broadcast
  Val convert(const Val& x, const std::string& et);
  Val reshape(const Val& x, const Shape& shape);
  Val broadcast_in_dim(const Val& x, const Shape& shape, const std::vector<int64_t>& dims);
  // x (of rank <= shape's) broadcast numpy-style (trailing dims aligned) to `shape`.
  Val broadcast_to(const Val& x, const Shape& shape);
  Val transpose(const Val& x, const std::vector<int64_t>& perm);
  Val slice(const Val& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
            const std::vector<int64_t>& strides = {});
  Val concat(const std::vector<Val>& xs, int64_t dim);
  Val pad(const Val& x, const Val& value, const std::vector<int64_t>& lo,
          const std::vector<int64_t>& hi);
  Val binary(const char* name, const Val& a, const Val& b);  // same shapes and types
  Val unary(const char* name, const Val& x);
  Val compare(const char* dir, const Val& a, const Val& b);  // "GT", "EQ", "NE", ...
  Val select(const Val& c, const Val& a, const Val& b);
  // Reduction over `dims` with the scalar combiner "add" or "maximum", init `init`.
  Val reduce(const Val& x, const std::vector<int64_t>& dims, const char* combiner, double init);
  Val dot_general(const Val& a, const Val& b, const std::vector<int64_t>& lhs_batch,
                  const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                  const std::vector<int64_t>& rhs_contract, const Shape& out);
  Val bitcast(const Val& x, const Shape& shape, const std::string& et);
  Val iota(const Shape& shape, int64_t dim, const std::string& et);
  Val dynamic_update_slice(const Val& x, const Val& update, const std::vector<int64_t>& start);

  // The module text with `results` returned by @main. `aliases`: (param, result) pairs whose
  // buffers may be shared (tf.aliasing_output): a donated param's buffer becomes the result.
  std::string module(const std::vector<Val>& results,
                     const std::vector<std::pair<size_t, size_t>>& aliases = {}) const;
  size_t num_params() const { return params_.size(); }

  // SPMD (decision 0060): the module is one program over `n` partitions; parameters and
  // results are replicated unless shard_param gives a parameter an HLO sharding
  // ("{devices=[4]0,1,2,3}": split in 4 along dim 0, piece i on partition i).
  void set_partitions(int n);
  int partitions() const { return partitions_; }
  void shard_param(const Val& p, const std::string& sharding);
  // A sharding constraint on an intermediate value (the Sharding custom call XLA's
  // partitioner reads), so propagation starts from the layout we chose.
  Val annotate_sharding(const Val& x, const std::string& sharding);

 private:
  Val op_named(const std::string& full_name, const std::vector<Val>& args,
               const std::string& attrs, const Shape& shape, const std::string& et);
  std::string fresh() { return "%" + std::to_string(next_++); }
  std::vector<Val> params_;
  std::vector<std::string> param_sharding_;
  int partitions_ = 1;
  std::string body_;
  int next_ = 0;
};

std::string i64_array(const std::vector<int64_t>& v);  // "array<i64: 1, 2>"

}  // namespace tessera::xla
