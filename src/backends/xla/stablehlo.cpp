#include "backends/xla/stablehlo.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "runtime/error.h"

namespace tessera::xla {

const char* element_type(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i64:
      return "i64";
    case DType::i32:
      return "i32";
    case DType::boolean:
      return "i1";
    case DType::f8e4m3:
      return "f8E4M3FN";
    case DType::f8e5m2:
      return "f8E5M2";
  }
  return "?";
}

std::string tensor_type(const Shape& shape, const std::string& et) {
  std::string s = "tensor<";
  for (int64_t d : shape) s += std::to_string(d) + "x";
  return s + et + ">";
}

std::string i64_array(const std::vector<int64_t>& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : ": ") + std::to_string(v[i]);
  return s + ">";
}

static bool is_float_et(const std::string& et) {
  return et[0] == 'f' || et[0] == 'b';
}

Val Hlo::param(const Shape& shape, const std::string& et) {
  Val v{"%arg" + std::to_string(params_.size()), shape, et};
  params_.push_back(v);
  return v;
}

Val Hlo::op(const std::string& name, const std::vector<Val>& args, const std::string& attrs,
            const Shape& shape, const std::string& et) {
  return op_named("stablehlo." + name, args, attrs, shape, et);
}

Val Hlo::constant(double v, const std::string& et) {
  std::string lit;
  if (et == "i1") {
    lit = v != 0 ? "true" : "false";
  } else if (!is_float_et(et)) {
    lit = std::to_string(int64_t(v));
  } else {
    // f32 bits in hex (exact, and the only spelling of inf and NaN); other floats convert.
    const float f = float(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08X", bits);
    Val c{fresh(), {}, "f32"};
    body_ += "    " + c.id + " = \"stablehlo.constant\"() {value = dense<" + buf +
             "> : tensor<f32>} : () -> tensor<f32>\n";
    return et == "f32" ? c : convert(c, et);
  }
  Val c{fresh(), {}, et};
  body_ += "    " + c.id + " = \"stablehlo.constant\"() {value = dense<" + lit + "> : tensor<" +
           et + ">} : () -> tensor<" + et + ">\n";
  return c;
}

Val Hlo::constant_vector(const std::vector<double>& v, const std::string& et) {
  std::string lit;
  char buf[40];
  for (size_t i = 0; i < v.size(); ++i) {
    // %.17e round-trips a double; an f32 value printed so parses back to the same float.
    std::snprintf(buf, sizeof buf, "%.17e", et == "f32" ? double(float(v[i])) : v[i]);
    lit += (i ? ", " : "") + std::string(buf);
  }
  const std::string t = tensor_type({int64_t(v.size())}, et);
  Val c{fresh(), {int64_t(v.size())}, et};
  body_ += "    " + c.id + " = \"stablehlo.constant\"() {value = dense<[" + lit + "]> : " + t +
           "} : () -> " + t + "\n";
  return c;
}

Val Hlo::splat(double v, const Shape& shape, const std::string& et) {
  Val c = constant(v, et);
  return shape.empty() ? c : broadcast_in_dim(c, shape, {});
}

Val Hlo::convert(const Val& x, const std::string& et) {
  if (x.et == et) return x;
  return op("convert", {x}, "", x.shape, et);
}

Val Hlo::reshape(const Val& x, const Shape& shape) {
  if (x.shape == shape) return x;
  return op("reshape", {x}, "", shape, x.et);
}

Val Hlo::broadcast_in_dim(const Val& x, const Shape& shape, const std::vector<int64_t>& dims) {
  return op("broadcast_in_dim", {x}, "broadcast_dimensions = " + i64_array(dims), shape, x.et);
}

Val Hlo::broadcast_to(const Val& x, const Shape& shape) {
  if (x.shape == shape) return x;
  const size_t off = shape.size() - x.shape.size();
  // Size-1 dims that stretch are dropped first: broadcast_in_dim maps dims one to one.
  Shape kept;
  std::vector<int64_t> dims;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (x.shape[i] == 1 && shape[off + i] != 1) continue;
    kept.push_back(x.shape[i]);
    dims.push_back(int64_t(off + i));
  }
  return broadcast_in_dim(reshape(x, kept), shape, dims);
}

Val Hlo::transpose(const Val& x, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == int64_t(i);
  if (identity) return x;
  Shape s;
  for (int64_t p : perm) s.push_back(x.shape[size_t(p)]);
  return op("transpose", {x}, "permutation = " + i64_array(perm), s, x.et);
}

Val Hlo::slice(const Val& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
               const std::vector<int64_t>& strides_in) {
  std::vector<int64_t> strides =
      strides_in.empty() ? std::vector<int64_t>(start.size(), 1) : strides_in;
  Shape s;
  bool whole = true;
  for (size_t i = 0; i < start.size(); ++i) {
    s.push_back((limit[i] - start[i] + strides[i] - 1) / strides[i]);
    whole = whole && start[i] == 0 && limit[i] == x.shape[i] && strides[i] == 1;
  }
  if (whole) return x;
  return op("slice", {x},
            "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                ", strides = " + i64_array(strides),
            s, x.et);
}

Val Hlo::concat(const std::vector<Val>& xs, int64_t dim) {
  if (xs.size() == 1) return xs[0];
  Shape s = xs[0].shape;
  s[size_t(dim)] = 0;
  for (const Val& x : xs) s[size_t(dim)] += x.shape[size_t(dim)];
  return op("concatenate", xs, "dimension = " + std::to_string(dim) + " : i64", s, xs[0].et);
}

Val Hlo::pad(const Val& x, const Val& value, const std::vector<int64_t>& lo,
             const std::vector<int64_t>& hi) {
  Shape s = x.shape;
  for (size_t i = 0; i < s.size(); ++i) s[i] += lo[i] + hi[i];
  return op("pad", {x, value},
            "edge_padding_low = " + i64_array(lo) + ", edge_padding_high = " + i64_array(hi) +
                ", interior_padding = " + i64_array(std::vector<int64_t>(lo.size(), 0)),
            s, x.et);
}

Val Hlo::binary(const char* name, const Val& a, const Val& b) {
  return op(name, {a, b}, "", a.shape, a.et);
}

Val Hlo::unary(const char* name, const Val& x) {
  return op(name, {x}, "", x.shape, x.et);
}

Val Hlo::compare(const char* dir, const Val& a, const Val& b) {
  return op("compare", {a, b},
            std::string("comparison_direction = #stablehlo<comparison_direction ") + dir + ">",
            a.shape, "i1");
}

Val Hlo::select(const Val& c, const Val& a, const Val& b) {
  return op("select", {c, a, b}, "", a.shape, a.et);
}

Val Hlo::reduce(const Val& x, const std::vector<int64_t>& dims, const char* combiner, double init) {
  Val i = constant(init, x.et);
  Shape s;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    bool reduced = false;
    for (int64_t r : dims) reduced = reduced || r == int64_t(d);
    if (!reduced) s.push_back(x.shape[d]);
  }
  const std::string st = "tensor<" + x.et + ">";
  Val r{fresh(), s, x.et};
  body_ += "    " + r.id + " = \"stablehlo.reduce\"(" + x.id + ", " + i.id + ") ({\n" +
           "    ^bb0(%a: " + st + ", %b: " + st + "):\n" + "      %c = \"stablehlo." + combiner +
           "\"(%a, %b) : (" + st + ", " + st + ") -> " + st + "\n" +
           "      \"stablehlo.return\"(%c) : (" + st + ") -> ()\n" +
           "    }) {dimensions = " + i64_array(dims) + "} : (" + tensor_type(x.shape, x.et) + ", " +
           st + ") -> " + tensor_type(s, x.et) + "\n";
  return r;
}

static std::string dims_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

Val Hlo::dot_general(const Val& a, const Val& b, const std::vector<int64_t>& lhs_batch,
                     const std::vector<int64_t>& rhs_batch,
                     const std::vector<int64_t>& lhs_contract,
                     const std::vector<int64_t>& rhs_contract, const Shape& out) {
  return op("dot_general", {a, b},
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = " +
                dims_list(lhs_batch) + ", rhs_batching_dimensions = " + dims_list(rhs_batch) +
                ", lhs_contracting_dimensions = " + dims_list(lhs_contract) +
                ", rhs_contracting_dimensions = " + dims_list(rhs_contract) + ">",
            out, a.et);
}

Val Hlo::bitcast(const Val& x, const Shape& shape, const std::string& et) {
  return op("bitcast_convert", {x}, "", shape, et);
}

Val Hlo::iota(const Shape& shape, int64_t dim, const std::string& et) {
  return op("iota", {}, "iota_dimension = " + std::to_string(dim) + " : i64", shape, et);
}

Val Hlo::dynamic_update_slice(const Val& x, const Val& update, const std::vector<int64_t>& start) {
  std::vector<Val> args{x, update};
  for (int64_t s : start) args.push_back(constant(double(s), "i64"));
  return op("dynamic_update_slice", args, "", x.shape, x.et);
}

void Hlo::set_partitions(int n) {
  partitions_ = n;
}

void Hlo::shard_param(const Val& p, const std::string& sharding) {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].id == p.id) {
      param_sharding_.resize(params_.size());
      param_sharding_[i] = sharding;
    }
}

Val Hlo::annotate_sharding(const Val& x, const std::string& sharding) {
  return op_named("stablehlo.custom_call", {x},
                  "call_target_name = \"Sharding\", mhlo.sharding = \"" + sharding + "\"",
                  x.shape, x.et);
}

Val Hlo::op_named(const std::string& full_name, const std::vector<Val>& args,
                  const std::string& attrs, const Shape& shape, const std::string& et) {
  Val r{fresh(), shape, et};
  std::string s = "    " + r.id + " = \"" + full_name + "\"(";
  std::string types;
  for (size_t i = 0; i < args.size(); ++i) {
    s += (i ? ", " : "") + args[i].id;
    types += (i ? ", " : "") + tensor_type(args[i].shape, args[i].et);
  }
  s += ")";
  if (!attrs.empty()) s += " {" + attrs + "}";
  s += " : (" + types + ") -> " + tensor_type(shape, et) + "\n";
  body_ += s;
  return r;
}

std::string Hlo::module(const std::vector<Val>& results,
                        const std::vector<std::pair<size_t, size_t>>& aliases) const {
  // An SPMD program (partitions > 1) says so on the module, and every parameter and result
  // carries its sharding: the ones set by shard_param, the rest replicated.
  const bool spmd = partitions_ > 1;
  std::string s = "module @tessera";
  if (spmd)
    s += " attributes {mhlo.num_partitions = " + std::to_string(partitions_) +
         " : i32, mhlo.num_replicas = 1 : i32}";
  s += " {\n  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    s += (i ? ", " : "") + params_[i].id + ": " + tensor_type(params_[i].shape, params_[i].et);
    std::vector<std::string> attrs;
    for (const auto& [p, r] : aliases)
      if (p == i) attrs.push_back("tf.aliasing_output = " + std::to_string(r) + " : i32");
    if (spmd) {
      const std::string sh = i < param_sharding_.size() && !param_sharding_[i].empty()
                                 ? param_sharding_[i]
                                 : "{replicated}";
      attrs.push_back("mhlo.sharding = \"" + sh + "\"");
    }
    for (size_t a = 0; a < attrs.size(); ++a) s += (a ? ", " : " {") + attrs[a];
    if (!attrs.empty()) s += "}";
  }
  s += ") -> (";
  std::string ret_ids, ret_types;
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string t = tensor_type(results[i].shape, results[i].et);
    s += (i ? ", " : "") + t + (spmd ? " {mhlo.sharding = \"{replicated}\"}" : "");
    ret_ids += (i ? ", " : "") + results[i].id;
    ret_types += (i ? ", " : "") + t;
  }
  s += ") {\n" + body_ + "    func.return " + ret_ids + " : " + ret_types + "\n  }\n}\n";
  return s;
}

}  // namespace tessera::xla
