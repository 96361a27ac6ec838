#include "runtime/executor.h"

#include "runtime/error.h"

namespace tessera::graph_detail {
namespace {

// Output metadata of a step: contiguous view of the spec, storage bound per run (or a slot).
Tensor out_meta(const TensorSpec& spec, const Device& device, std::shared_ptr<Storage> storage) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = spec.shape;
  impl->strides = contiguous_strides(spec.shape);
  impl->dtype = spec.dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

}  // namespace

void Executable::build(const std::vector<Node>& nodes, const Plan& plan,
                       std::vector<int64_t> value_base, std::vector<int> slot_of,
                       std::vector<size_t> slot_bytes, const Device& slot_device) {
  value_base_ = std::move(value_base);
  for (size_t b : slot_bytes) slots_.push_back(Storage::allocate(b, slot_device));
  std::vector<std::vector<int64_t>> ext_of(nodes.size());
  int64_t next_ext = 0;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t j = 0; j < nodes[i].inputs.size(); ++j) {
      int64_t e = -1;
      if (nodes[i].src_node[j] < 0)
        e = nodes[i].placeholder.empty() ? next_ext++ : nodes[i].placeholder[j];
      if (e >= n_ext_) n_ext_ = e + 1;
      ext_of[i].push_back(e);
    }
  auto add_input = [&](Step& p, int64_t i, int j) {
    const Node& n = nodes[i];
    const Tensor& meta = n.inputs[j];
    Arg a;
    if (n.src_node[j] >= 0) {
      a.value = value_base_[n.src_node[j]] + n.src_out[j];
    } else if (ext_of[i][j] >= 0) {
      a.ext = ext_of[i][j];
      a.offset = meta.offset();
    } else {
      p.ins.push_back(meta);  // a constant captured by a trace
      p.args.push_back(a);
      return;
    }
    auto impl = std::make_shared<TensorImpl>(*meta.impl());
    impl->storage = nullptr;
    impl->pending = nullptr;
    p.ins.emplace_back(std::move(impl));
    p.args.push_back(a);
  };
  auto add_output = [&](Step& p, int64_t i, int o) {
    const TensorSpec& spec = nodes[i].specs[o];
    const int64_t v = value_base_[i] + o;
    const int slot = slot_of.empty() ? -1 : slot_of[v];
    p.outs.push_back(out_meta(spec, nodes[i].device, slot < 0 ? nullptr : slots_[slot]));
    p.out_values.push_back(v);
    p.fresh.push_back(slot < 0);
    p.out_bytes.push_back(size_t(shape_numel(spec.shape)) * dtype_size(spec.dtype));
  };
  for (const graph_detail::Step& st : plan.steps) {
    Step p;
    int64_t dev_node = -1;
    if (st.node >= 0) {
      p.node = st.node;
      p.prim = nodes[st.node].prim;
      dev_node = st.node;
      for (size_t j = 0; j < nodes[st.node].inputs.size(); ++j) add_input(p, st.node, int(j));
      for (size_t o = 0; o < nodes[st.node].specs.size(); ++o) add_output(p, st.node, int(o));
    } else if (st.fused) {
      p.prim = st.fused;
      dev_node = st.outputs.front().first;
      for (const auto& [i, j] : st.ext_inputs) add_input(p, i, j);
      for (const auto& [i, o] : st.outputs) add_output(p, i, o);
    }
    if (dev_node >= 0) {
      const Device& d = nodes[dev_node].device;
      p.backend = &backend_for(d);
      // Fresh outputs have no storage here: a prepared kernel may not keep a run's buffers.
      p.kernel = p.backend->prepare(*p.prim, p.ins, p.outs);
    }
    for (const auto& [i, o] : st.release) p.release.push_back(value_base_[i] + o);
    steps_.push_back(std::move(p));
  }
  prepare_graph();
}

// One backend for every step, and it compiles graphs: the plan becomes one kernel.
void Executable::prepare_graph() {
  Backend* backend = nullptr;
  std::vector<GraphStep> g;
  std::vector<char> live(size_t(num_values()), 1);
  for (const Step& p : steps_) {
    for (int64_t v : p.release) live[size_t(v)] = 0;
    if (!p.backend) continue;
    if (backend && backend != p.backend) return;
    backend = p.backend;
    GraphStep s;
    s.prim = p.prim.get();
    s.ins = p.ins;
    s.outs = p.outs;
    for (const Arg& a : p.args) {
      s.in_value.push_back(a.value);
      s.in_ext.push_back(a.ext);
    }
    s.out_value = p.out_values;
    g.push_back(std::move(s));
  }
  if (backend && !g.empty()) graph_ = backend->prepare_graph(g, live);
}

void Executable::unbind() {
  for (auto& p : steps_) {
    for (size_t k = 0; k < p.args.size(); ++k)
      if (p.args[k].value >= 0 || p.args[k].ext >= 0) p.ins[k].impl()->storage.reset();
    for (size_t q = 0; q < p.outs.size(); ++q)
      if (p.fresh[q]) p.outs[q].impl()->storage.reset();
  }
  values_.clear();
}

void Executable::run(const ExecBinding& b) {
  values_.assign(size_t(num_values()), nullptr);
  ExecutionScope scope;
  if (graph_) {
    graph_->run(*b.ext, b.ext_offset, values_);
    return;
  }
  try {
    for (auto& p : steps_) {
      if (p.backend) {
        for (size_t k = 0; k < p.args.size(); ++k) {
          const Arg& a = p.args[k];
          if (a.value >= 0) {
            p.ins[k].impl()->storage = values_[a.value];
          } else if (a.ext >= 0) {
            TensorImpl& in = *p.ins[k].impl();
            in.storage = (*b.ext)[a.ext];
            if (b.ext_offset) in.offset = a.offset + (*b.ext_offset)[a.ext];
          }
        }
        for (size_t q = 0; q < p.outs.size(); ++q)
          if (p.fresh[q])
            p.outs[q].impl()->storage = Storage::allocate(p.out_bytes[q], p.outs[q].device());
        if (p.kernel)
          p.kernel->run(p.ins, p.outs);
        else
          p.backend->run(p.node >= 0 && b.prims ? *(*b.prims)[p.node] : *p.prim, p.ins, p.outs);
        for (size_t q = 0; q < p.outs.size(); ++q)
          values_[p.out_values[q]] = p.fresh[q] ? std::move(p.outs[q].impl()->storage)
                                                : p.outs[q].impl()->storage;
        for (size_t k = 0; k < p.args.size(); ++k)
          if (p.args[k].value >= 0 || p.args[k].ext >= 0) p.ins[k].impl()->storage.reset();
      }
      for (int64_t v : p.release) values_[v].reset();
    }
  } catch (...) {
    unbind();
    throw;
  }
}

}  // namespace tessera::graph_detail
