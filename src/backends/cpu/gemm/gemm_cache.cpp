// oneDNN engine, descriptors and the primitive / repacked-weight caches (onednn_util.h).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <list>
#include <optional>
#include <vector>

#include "backends/cpu/gemm/gemm_amx.h"
#include "backends/cpu/onednn_util.h"
#include "ops/linalg.h"
#include "runtime/cpu_features.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/parallel.h"

namespace tessera {
namespace onednn {
namespace {

std::atomic<int64_t> g_prim_hits{0}, g_prim_misses{0}, g_packed_hits{0}, g_packed_misses{0};

// TESSERA_CPU_ISA caps oneDNN too, so one machine can test every kernel path.
void cap_isa() {
  if (!env::is_set(EnvVar::cpu_isa)) return;
  switch (cpu_isa()) {
    case CpuIsa::scalar:
      dnnl::set_max_cpu_isa(dnnl::cpu_isa::sse41);
      break;
    case CpuIsa::avx2:
      dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx2);
      break;
    case CpuIsa::avx512:
      dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_vnni);
      break;
    case CpuIsa::avx512_bf16:
      dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
      break;
    case CpuIsa::amx_bf16:
      break;
  }
}

std::vector<void (*)()>& clear_fns() {
  static std::vector<void (*)()> fns;
  return fns;
}
std::mutex& clear_mu() {
  static std::mutex mu;
  return mu;
}

// Least-recently-used map of repacked weights, bounded in bytes: oneDNN layouts (`md`) and our
// AMX tile layout (`tiles`), each weight packed once per layout.
class PackedCache {
 public:
  struct Entry {
    std::string key;
    std::weak_ptr<Storage> owner;
    dnnl::memory::desc md;
    dnnl::memory mem;
    size_t bytes;
    std::shared_ptr<const uint16_t> tiles;
  };

  PackedCache() {
    // A third of this machine's memory, at least 4 GiB: a model whose packed weights do not fit
    // repacks every one of them every step (LRU under cyclic use); flux-mini's f32 linears are
    // 5.1 GB packed, so with 4 GiB an eager f32 step reordered all of them (page faults, 10%).
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) capacity_ = std::max(capacity_, size_t(pages) * size_t(page) / 3);
    if (const auto mb = env::integer(EnvVar::packed_weight_cache_mb)) capacity_ = size_t(*mb) << 20;
  }

  dnnl::memory get(const Tensor& w, const dnnl::memory::desc& user_md,
                   const dnnl::memory::desc& packed_md) {
    const std::string key = key_of(w);
    if (auto e = find(key, w, [&](const Entry& e) { return !e.tiles && e.md == packed_md; }))
      return e->mem;
    ++g_packed_misses;
    dnnl::memory packed = reorder_to(wrap(user_md, w), packed_md);
    insert(Entry{key, w.storage(), packed_md, packed, packed_md.get_size(), nullptr});
    return packed;
  }

  std::shared_ptr<const uint16_t> get_tiles(const Tensor& w) {
    const std::string key = key_of(w);
    if (auto e = find(key, w, [](const Entry& e) { return bool(e.tiles); })) return e->tiles;
    ++g_packed_misses;
    const int64_t N = w.dim(0), K = w.dim(1);
    const size_t bytes = amx_gemm::packed_b_elems(K, N) * sizeof(uint16_t);
    auto* buf = static_cast<uint16_t*>(std::aligned_alloc(64, bytes));
    TESSERA_CHECK(buf, "[linear] out of memory packing weight ", w.describe(), " (", bytes,
                  " bytes)");
    std::shared_ptr<const uint16_t> tiles(
        buf, [](const uint16_t* p) { std::free(const_cast<uint16_t*>(p)); });
    // B(k, n) = W[n, k].
    amx_gemm::pack_b(static_cast<const uint16_t*>(w.raw_data()), w.strides()[1], w.strides()[0], K,
                     N, buf);
    insert(Entry{key, w.storage(), {}, {}, bytes, tiles});
    return tiles;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    lru_.clear();
    index_.clear();
    bytes_ = 0;
  }
  void set_capacity(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = bytes;
    while (bytes_ > capacity_ && !lru_.empty()) erase_locked(std::prev(lru_.end()));
  }
  void stats(KernelCacheStats* s) {
    std::lock_guard<std::mutex> lock(mu_);
    s->packed_entries = int64_t(lru_.size());
    s->packed_bytes = bytes_;
  }

 private:
  using Iter = std::list<Entry>::iterator;

  static std::string key_of(const Tensor& w) {
    KeyBuilder kb;
    kb.add(int64_t(reinterpret_cast<uintptr_t>(w.storage().get()))).add(w.offset()).add(w);
    return kb.str();
  }
  // A copy of the live entry for w's storage that `match` accepts (moved to the front).
  template <typename Match>
  std::optional<Entry> find(const std::string& key, const Tensor& w, Match&& match) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    for (auto lit : it->second) {
      auto owner = lit->owner.lock();
      if (owner.get() == w.storage().get() && match(*lit)) {
        lru_.splice(lru_.begin(), lru_, lit);
        ++g_packed_hits;
        return *lit;
      }
    }
    return std::nullopt;
  }
  void insert(Entry e) {
    std::lock_guard<std::mutex> lock(mu_);
    drop_dead_locked(e.key);
    if (e.bytes > capacity_) return;
    bytes_ += e.bytes;
    const std::string key = e.key;
    lru_.push_front(std::move(e));
    index_[key].push_back(lru_.begin());
    while (bytes_ > capacity_ && !lru_.empty()) erase_locked(std::prev(lru_.end()));
  }
  void erase_locked(Iter it) {
    auto& v = index_[it->key];
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] == it) {
        v.erase(v.begin() + int64_t(i));
        break;
      }
    }
    if (v.empty()) index_.erase(it->key);
    bytes_ -= it->bytes;
    lru_.erase(it);
  }
  // Entries whose storage died (its address may now belong to another tensor).
  void drop_dead_locked(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    std::vector<Iter> dead;
    for (auto lit : it->second)
      if (lit->owner.expired()) dead.push_back(lit);
    for (auto d : dead) erase_locked(d);
  }

  std::mutex mu_;
  std::list<Entry> lru_;
  std::unordered_map<std::string, std::vector<Iter>> index_;
  size_t bytes_ = 0;
  size_t capacity_ = size_t(4) << 30;
};

PackedCache& packed_cache() {
  static PackedCache c;
  return c;
}

}  // namespace

dnnl::engine& engine() {
  static dnnl::engine e = [] {
    cap_isa();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

void sync_threads() {
  sync_threads(num_threads());
}

void sync_threads(int n) {
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

dnnl::memory scratchpad(const dnnl::memory::desc& md) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> buf;
  thread_local size_t bytes = 0;
  const size_t need = md.get_size();
  if (need > bytes) {
    bytes = (need + 4095) / 4096 * 4096;
    buf.reset(std::aligned_alloc(4096, bytes));
    TESSERA_CHECK(buf != nullptr, "[onednn] out of memory for a ", need, "-byte scratchpad");
  }
  return dnnl::memory(md, engine(), need ? buf.get() : nullptr);
}

int gemm_threads(int64_t macs) {
  return macs < min_parallel_work() ? 1 : num_threads();
}

dnnl::memory::data_type data_type(DType t, const char* op) {
  switch (t) {
    case DType::f32:
      return dnnl::memory::data_type::f32;
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::f16:
      return dnnl::memory::data_type::f16;
    default:
      TESSERA_FAIL("[", op, "] unsupported dtype ", dtype_name(t), ", expected f32 or bf16");
  }
}

bool has_bf16_matmul() {
  static const bool ok = [] {
    try {
      const dnnl::memory::desc md({16, 16}, dnnl::memory::data_type::bf16,
                                  dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

dnnl::memory::desc view_desc(const Shape& dims, const Strides& strides, DType t, const char* op) {
  int64_t extent = 1;
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] > 1) extent = std::max(extent, strides[i] * dims[i]);
  dnnl::memory::dims d(dims.begin(), dims.end()), s(strides.begin(), strides.end());
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] <= 1) s[i] = extent;
  return dnnl::memory::desc(d, data_type(t, op), s);
}

dnnl::memory::desc view_desc(const Tensor& t, const char* op) {
  return view_desc(t.shape(), t.strides(), t.dtype(), op);
}

KeyBuilder& KeyBuilder::add(const std::vector<int64_t>& v) {
  for (int64_t x : v) add(x);
  s_ += ';';
  return *this;
}

KeyBuilder& KeyBuilder::add(const Tensor& t) {
  add(int64_t(t.dtype()));
  add(t.shape());
  return add(t.strides());
}

void count_primitive(bool hit) {
  ++(hit ? g_prim_hits : g_prim_misses);
}

void register_cache_clear(void (*fn)()) {
  std::lock_guard<std::mutex> lock(clear_mu());
  clear_fns().push_back(fn);
}

dnnl::memory reorder_to(const dnnl::memory& src, const dnnl::memory::desc& md) {
  dnnl::memory dst(md, engine());
  sync_threads();
  dnnl::reorder(src, dst).execute(stream(), const_cast<dnnl::memory&>(src), dst);
  stream().wait();
  return dst;
}

dnnl::memory packed_weights(const Tensor& w, const dnnl::memory::desc& user_md,
                            const dnnl::memory::desc& packed_md) {
  return packed_cache().get(w, user_md, packed_md);
}

}  // namespace onednn

std::shared_ptr<const uint16_t> amx_gemm::packed_weight(const Tensor& w) {
  return onednn::packed_cache().get_tiles(w);
}

KernelCacheStats kernel_cache_stats() {
  KernelCacheStats s;
  s.primitive_hits = onednn::g_prim_hits.load();
  s.primitive_misses = onednn::g_prim_misses.load();
  s.packed_hits = onednn::g_packed_hits.load();
  s.packed_misses = onednn::g_packed_misses.load();
  onednn::packed_cache().stats(&s);
  return s;
}

void clear_kernel_caches() {
  onednn::packed_cache().clear();
  std::lock_guard<std::mutex> lock(onednn::clear_mu());
  for (auto fn : onednn::clear_fns()) fn();
}

void set_packed_weight_cache_capacity(size_t bytes) {
  onednn::packed_cache().set_capacity(bytes);
}

}  // namespace tessera
