// The planning passes over a recorded graph: fusion grouping (which nodes run as one fused
// kernel), steps with release points (liveness), and compiled mode's static memory plan.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "runtime/backend.h"
#include "runtime/fusion.h"
#include "runtime/graph_plan.h"

namespace tessera::graph_detail {
namespace {

bool is_direct(const Tensor& t, const TensorSpec& spec) {
  return t.offset() == 0 && t.shape() == spec.shape && t.is_contiguous();
}


size_t spec_bytes(const TensorSpec& s, const Device& d) {
  return backend_for(d).allocator(d).block_size(size_t(shape_numel(s.shape)) * dtype_size(s.dtype));
}

// Values each step allocates, in order.
std::vector<std::pair<int64_t, int>> step_allocations(const Step& st, const std::vector<Node>& n) {
  if (st.node >= 0) {
    std::vector<std::pair<int64_t, int>> out;
    for (size_t o = 0; o < n[st.node].specs.size(); ++o) out.push_back({st.node, int(o)});
    return out;
  }
  return st.fused ? st.outputs : std::vector<std::pair<int64_t, int>>{};
}

}  // namespace

Grouping group_nodes(const std::vector<Node>& nodes, bool fuse) {
  const int64_t nn = int64_t(nodes.size());
  std::vector<int64_t> group_of(size_t(nn), -1);
  std::vector<char> rowwise(size_t(nn), 0), fusible(size_t(nn), 0);
  for (int64_t i = 0; i < nn; ++i) {
    bool rw = false;
    fusible[i] = fuse && fusion_supported(nodes[i].device) &&
                 is_fusible(*nodes[i].prim, nodes[i].inputs, nodes[i].specs, &rw);
    rowwise[i] = rw;
  }
  // Groups: several open at once, one per chain (FLUX's image and text streams interleave
  // chains of different shapes). A node joins an open group of its shape when it reads that
  // group's values only directly (or none); every other open group it reads from is closed
  // (emitted) first. Open groups never read each other (reading one closes it), and a node
  // emitted on its own reads no open group, so emitting a group where it closes keeps the order
  // a valid schedule.
  struct Open {
    std::vector<int64_t> members;
    Shape shape;
    int64_t id;
  };
  constexpr size_t kMaxOpen = 4;  // bounds planning work; the oldest closes first
  Grouping order;                 // emitted units: one node or one group
  std::vector<Open> open;
  int64_t next_id = 0;
  std::vector<char> dep, direct;
  auto close_at = [&](size_t g) {
    // Row-wise ops alone (q and k norms side by side) gain nothing from one kernel and would
    // lose their prepared kernels: they stay steps of their own.
    bool all_rowwise = true;
    for (int64_t m : open[g].members) all_rowwise = all_rowwise && rowwise[m];
    if (all_rowwise && open[g].members.size() > 1) {
      for (int64_t m : open[g].members) order.push_back({m});
    } else {
      order.push_back(std::move(open[g].members));
    }
    open.erase(open.begin() + int64_t(g));
  };
  for (int64_t i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    dep.assign(open.size(), 0);
    direct.assign(open.size(), 1);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const int64_t s = n.src_node[j];
      if (s < 0 || group_of[s] < 0) continue;
      for (size_t g = 0; g < open.size(); ++g) {
        if (open[g].id != group_of[s]) continue;
        dep[g] = 1;
        if (!is_direct(n.inputs[j], nodes[s].specs[n.src_out[j]])) direct[g] = 0;
      }
    }
    int64_t join = -1;
    if (fusible[i]) {
      for (int64_t g = int64_t(open.size()) - 1; g >= 0 && join < 0; --g)
        if (n.specs[0].shape == open[g].shape && (!dep[g] || (direct[g] && !rowwise[i]))) join = g;
    }
    for (int64_t g = int64_t(open.size()) - 1; g >= 0; --g) {
      if (!dep[g] || g == join) continue;
      close_at(size_t(g));
      if (g < join) --join;
    }
    if (join >= 0) {
      open[join].members.push_back(i);
      group_of[i] = open[join].id;
      continue;
    }
    if (fusible[i]) {
      if (open.size() >= kMaxOpen) close_at(0);
      open.push_back({{i}, n.specs[0].shape, next_id});
      group_of[i] = next_id++;
      continue;
    }
    order.push_back({i});
  }
  while (!open.empty()) close_at(0);
  return order;
}

std::shared_ptr<Plan> plan_from_grouping(const std::vector<Node>& nodes,
                                         const std::vector<std::vector<char>>& live,
                                         Grouping order) {
  const int64_t nn = int64_t(nodes.size());
  auto plan = std::make_shared<Plan>();
  // Consumers, for outputs needed outside a group and for release points.
  std::vector<std::vector<int64_t>> last_use(static_cast<size_t>(nn));
  for (int64_t i = 0; i < nn; ++i) last_use[i].assign(nodes[i].specs.size(), -1);
  std::vector<int64_t> unit_of(size_t(nn), -1);
  for (size_t u = 0; u < order.size(); ++u)
    for (int64_t i : order[u]) unit_of[i] = int64_t(u);
  std::vector<std::vector<char>> needed(static_cast<size_t>(nn));
  for (int64_t i = 0; i < nn; ++i) needed[i] = live[i];
  for (int64_t i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const int64_t s = n.src_node[j];
      if (s < 0) continue;
      auto& lu = last_use[s][n.src_out[j]];
      lu = std::max(lu, unit_of[i]);
      if (unit_of[s] != unit_of[i] || order[unit_of[i]].size() == 1 ||
          !is_direct(n.inputs[j], nodes[s].specs[n.src_out[j]]))
        needed[s][n.src_out[j]] = 1;
    }
  }
  std::vector<std::vector<std::pair<int64_t, int>>> release(order.size());
  for (int64_t i = 0; i < nn; ++i)
    for (size_t o = 0; o < nodes[i].specs.size(); ++o)
      if (!live[i][o]) release[std::max(last_use[i][o], unit_of[i])].push_back({i, int(o)});

  for (size_t u = 0; u < order.size(); ++u) {
    Step st;
    st.release = std::move(release[u]);
    const auto& members = order[u];
    if (members.size() == 1) {
      st.node = members[0];
      plan->allocations += int64_t(nodes[st.node].specs.size());
      plan->steps.push_back(std::move(st));
      continue;
    }
    std::vector<FusedInstr> prog;
    std::vector<int> out_values;
    std::string label = "fused(";
    std::unordered_map<int64_t, int> value_of;
    for (size_t m = 0; m < members.size(); ++m) {
      const int64_t i = members[m];
      const Node& n = nodes[i];
      std::vector<FusedOperand> ops;
      for (size_t j = 0; j < n.inputs.size(); ++j) {
        const int64_t s = n.src_node[j];
        if (s >= 0 && unit_of[s] == int64_t(u)) {
          ops.push_back({false, value_of.at(s)});
        } else {
          ops.push_back({true, int(st.ext_inputs.size())});
          st.ext_inputs.push_back({i, int(j)});
        }
      }
      append_fused_instr(prog, n.prim, n.inputs, ops, n.specs[0].dtype);
      value_of[i] = int(m);
      label += (m ? "," : "") + std::string(n.prim->name());
      if (needed[i][0]) {
        out_values.push_back(int(m));
        st.outputs.push_back({i, 0});
      }
    }
    label += ")";
    if (st.outputs.empty()) {  // nothing reads any value of the group: dead, skip it
      if (!st.release.empty()) plan->steps.push_back(std::move(st));
      continue;
    }
    st.fused = std::make_shared<FusedKernel>(std::move(prog), std::move(out_values), label);
    st.fused_ops = int64_t(members.size());
    plan->fused_kernels++;
    plan->fused_ops += st.fused_ops;
    plan->allocations += int64_t(st.outputs.size());
    plan->steps.push_back(std::move(st));
  }
  plan->grouping = std::move(order);
  return plan;
}

// A value never shares a slot with an input of the step that writes it.
void plan_memory(const std::vector<Node>& nodes, const Plan& plan,
                 const std::vector<int64_t>& value_base,
                 const std::vector<std::vector<char>>& live, MemoryPlan* out) {
  MemoryPlan& p = *out;
  std::multimap<size_t, int> free_slots;
  p.slot_of.assign(size_t(value_base.back()), -1);
  for (const Step& st : plan.steps) {
    for (const auto& [i, o] : step_allocations(st, nodes)) {
      if (live[i][o]) continue;
      const size_t bytes = spec_bytes(nodes[i].specs[o], nodes[i].device);
      auto it = free_slots.find(bytes);
      int slot;
      if (it != free_slots.end()) {
        slot = it->second;
        free_slots.erase(it);
      } else {
        slot = int(p.slot_bytes.size());
        p.slot_bytes.push_back(bytes);
      }
      p.slot_of[value_base[i] + o] = slot;
    }
    for (const auto& [i, o] : st.release) {
      const int slot = p.slot_of[value_base[i] + o];
      if (slot >= 0) free_slots.emplace(p.slot_bytes[slot], slot);
    }
  }
}

bool memory_plan_valid(const std::vector<Node>& nodes, const Plan& plan,
                       const std::vector<int64_t>& value_base,
                       const std::vector<std::vector<char>>& live, const MemoryPlan& p) {
  if (p.slot_of.size() != size_t(value_base.back())) return false;
  std::vector<char> busy(p.slot_bytes.size(), 0);
  for (const Step& st : plan.steps) {
    for (const auto& [i, o] : step_allocations(st, nodes)) {
      const int slot = p.slot_of[value_base[i] + o];
      if (live[i][o]) {
        if (slot != -1) return false;
        continue;
      }
      if (slot < 0 || size_t(slot) >= busy.size() || busy[slot]) return false;
      if (p.slot_bytes[slot] < spec_bytes(nodes[i].specs[o], nodes[i].device)) return false;
      busy[slot] = 1;
    }
    for (const auto& [i, o] : st.release) {
      const int slot = p.slot_of[value_base[i] + o];
      if (slot >= 0) busy[slot] = 0;
    }
  }
  for (size_t v = 0; v < p.slot_of.size(); ++v)
    if (p.slot_of[v] >= int(p.slot_bytes.size())) return false;
  return true;
}

bool grouping_valid(const Grouping& g, const std::vector<Node>& nodes) {
  std::vector<int64_t> unit(nodes.size(), -1);
  for (size_t u = 0; u < g.size(); ++u) {
    if (g[u].empty()) return false;
    for (int64_t i : g[u]) {
      if (i < 0 || size_t(i) >= nodes.size() || unit[i] >= 0) return false;
      unit[i] = int64_t(u);
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (unit[i] < 0) return false;
  for (size_t u = 0; u < g.size(); ++u) {
    for (size_t m = 0; m < g[u].size(); ++m) {
      const Node& n = nodes[g[u][m]];
      for (int64_t s : n.src_node) {
        if (s < 0) continue;
        if (unit[s] > int64_t(u)) return false;
        if (unit[s] == int64_t(u)) {  // in-group producers come earlier in the group
          bool earlier = false;
          for (size_t k = 0; k < m; ++k) earlier = earlier || g[u][k] == s;
          if (!earlier) return false;
        }
      }
      if (g[u].size() > 1) {
        bool rw = false;
        if (!is_fusible(*n.prim, n.inputs, n.specs, &rw)) return false;
        if (n.specs[0].shape != nodes[g[u][0]].specs[0].shape) return false;
      }
    }
  }
  return true;
}

}  // namespace tessera::graph_detail
