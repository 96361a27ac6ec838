#include "backends/xla/xla_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "backends/xla/executable_cache.h"
#include "backends/xla/pjrt_client.h"
#include "backends/xla/stablehlo.h"
#include "backends/xla/xla_lowering.h"
#include "ops/copy.h"
#include "runtime/compile.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/fusion.h"
#include "runtime/sharding.h"

namespace tessera {
namespace {

using xla::Hlo;
using xla::PjrtClient;
using xla::PjrtExecutable;
using xla::Val;

std::mutex g_stats_mu;
XlaStats g_stats;
std::string g_last_module;
// Buffer donation (decision 0050): TESSERA_XLA_DONATE, read once; set_xla_donation for tests.
std::atomic<int> g_donate{-1};
bool donation_on() {
  int v = g_donate.load();
  if (v < 0) g_donate = v = env::flag(EnvVar::xla_donate) ? 1 : 0;
  return v == 1;
}

// Compile-only (AOT) state, guarded by g_stats_mu.
bool g_compile_only = false;
std::string g_tpu_topology;
std::vector<XlaAotProgram> g_aot_programs;

bool compile_only() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  return g_compile_only;
}

// A storage's block on an XLA device: one u8[nbytes] PJRT buffer (null until first written).
// Bytes keep a storage's dtype free, as on the CPU: programs bitcast them to each view's dtype.
// SPMD (decision 0060): a storage split over devices (Storage::sharding) holds one buffer per
// device instead (`shards`, piece i on device + i); a whole storage that an SPMD program read or
// wrote keeps its copies on the mesh's other devices (`copies`) until its bytes change.
struct Block {
  PJRT_Buffer* buf = nullptr;
  size_t nbytes = 0;
  int device = 0;
  PjrtClient* client = nullptr;  // the plugin that owns buf
  std::vector<PJRT_Buffer*> shards;
  std::map<int, PJRT_Buffer*> copies;
  void drop_copies() {
    for (auto& [d, b] : copies) client->destroy(b);
    copies.clear();
  }
  // Replaces the bytes (the copies on other devices are stale).
  void set(PJRT_Buffer* nb) {
    drop_copies();
    client->destroy(std::exchange(buf, nb));
  }
};

Block& block_of(const Storage& s) {
  return *static_cast<Block*>(s.data());
}

// Piece i of a split storage's bytes (StorageSharding): for every index of the dims before the
// split dim, its ranges along that dim, so the piece is the contiguous tensor read_shard gives.
struct PieceLayout {
  int64_t outer = 1, inner = 1;  // inner: bytes per index of the split dim
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges;  // per piece
  int64_t full_dim = 0;
};
PieceLayout piece_layout(const StorageSharding& sh) {
  PieceLayout l;
  const size_t d = size_t(sh.spec.dim);
  for (size_t i = 0; i < sh.shape.size(); ++i) {
    if (i < d) l.outer *= sh.shape[i];
    if (i > d) l.inner *= sh.shape[i];
  }
  l.inner *= int64_t(dtype_size(sh.dtype));
  l.full_dim = sh.shape[d];
  for (int64_t p = 0; p < sh.spec.parts; ++p) {
    ShardSpec s = sh.spec;
    s.index = p;
    l.ranges.push_back(s.ranges(l.full_dim));
  }
  return l;
}
// Copies between the whole tensor's bytes and piece p's (to_piece: whole -> piece).
void copy_piece(const PieceLayout& l, int64_t p, char* whole, char* piece, bool to_piece) {
  char* out = piece;
  for (int64_t o = 0; o < l.outer; ++o)
    for (const auto& [b, e] : l.ranges[size_t(p)]) {
      char* w = whole + (o * l.full_dim + b) * l.inner;
      const size_t n = size_t((e - b) * l.inner);
      if (to_piece)
        std::memcpy(out, w, n);
      else
        std::memcpy(w, out, n);
      out += n;
    }
}

// A split storage's pieces are typed buffers of shape [1, local shape] (XLA's partitioner follows
// elements through reshapes and transposes, not bytes through bitcasts).
Shape piece_dims(const StorageSharding& sh) {
  Shape d{1};
  const Shape local = sh.spec.local_shape(sh.shape);
  d.insert(d.end(), local.begin(), local.end());
  return d;
}

// "{devices=[1,4,1]0,1,2,3}": split in `parts` along `dim` of a rank-`rank` value.
std::string tile_sharding(size_t rank, size_t dim, int64_t parts) {
  std::string s = "{devices=[";
  for (size_t i = 0; i < rank; ++i) {
    if (i) s += ',';
    s += std::to_string(i == dim ? parts : 1);
  }
  s += ']';
  for (int64_t i = 0; i < parts; ++i) {
    if (i) s += ',';
    s += std::to_string(i);
  }
  s += '}';
  return s;
}

class XlaAllocator final : public Allocator {
 public:
  XlaAllocator(PjrtClient* client, int device) : client_(client), device_(device) {}
  void* allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes += int64_t(bytes);
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
    stats_.alloc_count++;
    return new Block{nullptr, bytes, device_, client_};
  }
  void deallocate(void* p, size_t bytes) override;
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  void empty_cache() override {}  // PJRT owns the device memory; nothing is cached here

 private:
  PjrtClient* client_;
  int device_;
  mutable std::mutex mu_;
  MemoryStats stats_;
};

// A platform's plugin client (xla:cpu, xla:cuda or tpu), loaded at first use.
struct Platform {
  std::string name;
  std::unique_ptr<PjrtClient> client;
  std::string error;  // why it could not be loaded ("" when not tried or loaded)
  bool tried = false;
  std::vector<std::unique_ptr<XlaAllocator>> allocators;
  int cpu_devices = 0;  // the CPU plugin's device count (0: TESSERA_XLA_CPU_DEVICES)
};

class XlaBackend final : public Backend {
 public:
  explicit XlaBackend(DeviceType type) : type_(type) {
    if (type == DeviceType::tpu) {
      platforms_.push_back({"tpu", nullptr, "", false, {}});
    } else {
      platforms_.push_back({"cpu", nullptr, "", false, {}});
      platforms_.push_back({"cuda", nullptr, "", false, {}});
    }
  }
  const char* name() const override { return type_ == DeviceType::tpu ? "tpu" : "xla"; }
  DeviceType device_type() const override { return type_; }

  std::vector<Device> devices() const override {
    std::vector<Device> out;
    for (auto& p : platforms_) {
      auto* self = const_cast<XlaBackend*>(this);
      Platform& pl = self->load(p.name, false);
      if (!pl.client) continue;
      for (size_t i = 0; i < pl.client->num_devices(); ++i) out.push_back(device_of(pl, int(i)));
    }
    return out;
  }

  // Only platforms whose plugin is loaded: a sweep over every backend must not load one.
  std::vector<Device> started_devices() const override {
    std::vector<Device> out;
    for (const Platform& p : platforms_)
      if (p.client)
        for (size_t i = 0; i < p.client->num_devices(); ++i) out.push_back(device_of(p, int(i)));
    return out;
  }

  std::string why_unavailable(const Device& d) const override {
    auto* self = const_cast<XlaBackend*>(this);
    const std::string name = type_ == DeviceType::tpu ? "tpu" : d.platform;
    for (auto& p : platforms_)
      if (p.name == name) {
        Platform& pl = self->load(name, false);
        if (!pl.client) return pl.error;
        return "the " + name + " plugin has " + std::to_string(pl.client->num_devices()) +
               " device(s)";
      }
    return "";
  }

  Allocator& allocator(const Device& d) override {
    Platform& p = platform(d);
    return *p.allocators[size_t(d.index)];
  }

  void prepare_sharding(const Device& d, int parts, const char* where) override {
    const std::string name = type_ == DeviceType::tpu ? "tpu" : d.platform;
    Platform* pl = nullptr;
    for (auto& p : platforms_)
      if (p.name == name) pl = &p;
    TESSERA_CHECK(pl, where, " no platform ", name, " on backend ", this->name());
    const int want = d.index + parts;
    if (!pl->tried && name == "cpu")  // the plugin starts with as many devices as the mesh needs
      pl->cpu_devices =
          std::max<int>(want, int(env::integer(EnvVar::xla_cpu_devices).value_or(1)));
    Platform& p = load(name, true);
    const int have = int(p.client->compile_only() ? p.client->target_devices()
                                                  : p.client->num_devices());
    TESSERA_CHECK(want <= have, where, " a program over ", parts, " devices from ", d.str(),
                  " needs ", want, " devices, but ", name == "cpu" ? "xla:cpu" : name, " has ",
                  have,
                  name == "cpu" ? " (its plugin started before; set TESSERA_XLA_CPU_DEVICES="
                                  + std::to_string(want) + " to start it with more)"
                                : std::string());
  }

  void copy_to_host(const Storage& src, size_t offset, void* dst, size_t bytes) override {
    if (bytes == 0) return;
    const Block& b = block_of(src);
    if (src.sharding) {  // gathered: every device's piece into the whole tensor's bytes
      TESSERA_CHECK(!compile_only(), "[xla] ", src.device().str(),
                    " is compiling ahead of time only: its tensors hold no data to read");
      const PieceLayout l = piece_layout(*src.sharding);
      std::vector<char> all(b.nbytes, 0), piece(b.nbytes / size_t(src.sharding->spec.parts));
      for (size_t p = 0; p < b.shards.size(); ++p) {
        b.client->download(b.shards[p], piece.data(), piece.size());
        copy_piece(l, int64_t(p), all.data(), piece.data(), false);
      }
      std::memcpy(dst, all.data() + offset, bytes);
      return;
    }
    TESSERA_CHECK(offset + bytes <= b.nbytes, "[xla] read past the end of a storage");
    TESSERA_CHECK(!compile_only(), "[xla] ", src.device().str(),
                  " is compiling ahead of time only: its tensors hold no data to read");
    if (!b.buf) {  // never written: zeros, as a fresh buffer reads on the CPU after zeros()
      std::memset(dst, 0, bytes);
      return;
    }
    PjrtClient& c = client(src.device());
    if (offset == 0 && bytes == b.nbytes) {
      c.download(b.buf, dst, bytes);
      return;
    }
    std::vector<char> all(b.nbytes);
    c.download(b.buf, all.data(), all.size());
    std::memcpy(dst, all.data() + offset, bytes);
  }

  void copy_from_host(const void* src, Storage& dst, size_t offset, size_t bytes) override {
    if (bytes == 0) return;
    Block& b = block_of(dst);
    TESSERA_CHECK(offset + bytes <= b.nbytes, "[xla] write past the end of a storage");
    PjrtClient& c = client(dst.device());
    if (compile_only()) return;  // programs need shapes only: nothing is uploaded
    if (dst.sharding) {  // each device receives only its piece
      TESSERA_CHECK(offset == 0 && bytes == b.nbytes, "[xla] a tensor split over devices is "
                    "written whole (", bytes, " of its ", b.nbytes, " bytes given)");
      const PieceLayout l = piece_layout(*dst.sharding);
      const int64_t parts = dst.sharding->spec.parts;
      const Shape dims = piece_dims(*dst.sharding);
      std::vector<char> piece(b.nbytes / size_t(parts));
      std::vector<PJRT_Buffer*> shards;
      for (int64_t p = 0; p < parts; ++p) {
        copy_piece(l, p, static_cast<char*>(const_cast<void*>(src)), piece.data(), true);
        shards.push_back(c.upload_typed(piece.data(), piece.size(), dst.sharding->dtype, dims,
                                        b.device + int(p)));
      }
      for (PJRT_Buffer* old : std::exchange(b.shards, shards)) c.destroy(old);
      return;
    }
    PJRT_Buffer* nb;
    if (offset == 0 && bytes == b.nbytes) {
      nb = c.upload_bytes(src, bytes, b.device);
    } else {  // a part: patch the current bytes on the host (rare: whole tensors move)
      std::vector<char> all(b.nbytes, 0);
      if (b.buf) c.download(b.buf, all.data(), all.size());
      std::memcpy(all.data() + offset, src, bytes);
      nb = c.upload_bytes(all.data(), all.size(), b.device);
    }
    b.set(nb);
  }

  void synchronize(const Device& d) override {
    Platform& p = platform(d);
    if (!p.client) return;
    std::string first_error;
    for (PJRT_Event* e : pending_) {
      try {
        p.client->await(e, "an executable");
      } catch (const std::exception& ex) {
        if (first_error.empty()) first_error = ex.what();
      }
    }
    pending_.clear();
    if (!first_error.empty()) TESSERA_FAIL(first_error);
  }
  // Downloads wait for their buffer's producer (PJRT orders work by buffer).
  void wait_for(const Storage&) override {}
  bool on_kernel_thread() const override { return false; }

  // Fused kernels are CPU programs; an XLA device runs ops one by one (or whole segments).
  bool supports(const Primitive& p, const std::vector<DType>&) const override {
    return dynamic_cast<const FusedKernel*>(&p) == nullptr;
  }
  void launch(PrimitivePtr p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) override {
    run(*p, ins, outs);  // PJRT executes asynchronously already
  }
  void run(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) override;
  std::unique_ptr<PreparedKernel> prepare(Primitive&, const std::vector<Tensor>&,
                                          const std::vector<Tensor>&) override {
    return nullptr;  // run() finds the executable in its cache
  }
  void copy(const Tensor& src, Tensor& dst) override {
    Copy c;
    std::vector<Tensor> out{dst};
    run(c, {src}, out);
  }
  std::unique_ptr<GraphKernel> prepare_graph(const std::vector<GraphStep>& steps,
                                             const std::vector<char>& live_out) override;

  // An input view as a value of its logical shape: the storage's bytes sliced, bitcast to the
  // dtype and cut to the view with slices, reshapes and a transpose (no gather).
  static bool view_value(Hlo& h, const Tensor& t, const Val& bytes, Val& out);
  // A value as the bytes of its contiguous layout (u8[numel * size]).
  static Val to_bytes(Hlo& h, const Val& r, DType dt);
  PjrtClient& client_of(const Device& d) { return client(d); }
  // Compiles `text` once per client: an op, a segment and a program with the same module (a
  // one-op segment) share one executable.
  std::shared_ptr<PjrtExecutable> compile(PjrtClient& c, const std::string& text,
                                          int64_t ops = 1, int partitions = 1) {
    auto& slot = modules_[&c][text + "#" + std::to_string(partitions)];
    if (slot) {
      std::lock_guard<std::mutex> lock(g_stats_mu);
      g_stats.module_hits++;
      return slot;
    }
    slot = compile_or_load(c, text, ops, partitions);
    return slot;
  }
  // The cache folder's executable for `text` when one is there and loads, else the plugin's
  // compile (written to the folder). Compile-only: always compiled, and reported.
  std::shared_ptr<PjrtExecutable> compile_or_load(PjrtClient& c, const std::string& text,
                                                  int64_t ops, int partitions = 1);
  void track_event(PjrtClient& c, PJRT_Event* e) { track(c, e); }

 private:
  Device device_of(const Platform& p, int i) const {
    Device d;
    d.type = type_;
    d.index = i;
    if (type_ == DeviceType::xla) d.platform = p.name;
    return d;
  }

  Platform& load(const std::string& name, bool throw_on_error) {
    Platform* pl = nullptr;
    for (auto& p : platforms_)
      if (p.name == name) pl = &p;
    TESSERA_CHECK(pl, "[xla] no platform ", name, " on backend ", this->name());
    if (!pl->tried) {
      pl->tried = true;
      const std::string path = xla::default_plugin_path(name);
      if (path.empty()) {
        pl->error = "[xla] no PJRT plugin for " + name + " (" +
                    (name == "cpu" ? "scripts/setup_xla.sh installs it, or set TESSERA_PJRT_PLUGIN"
                     : name == "cuda" ? "set TESSERA_PJRT_CUDA_PLUGIN to jax-cuda13-pjrt's .so"
                                      : "TESSERA_LIBTPU=1 scripts/setup_xla.sh installs libtpu, "
                                        "or set TESSERA_LIBTPU_PATH") +
                    ")";
      } else {
        try {
          std::string topology;
          {
            std::lock_guard<std::mutex> lock(g_stats_mu);
            if (g_compile_only && name == "tpu") topology = g_tpu_topology;
          }
          const int cpu_devices =
              pl->cpu_devices > 0 ? pl->cpu_devices
                                  : int(env::integer(EnvVar::xla_cpu_devices).value_or(1));
          pl->client = topology.empty()
                           ? std::make_unique<PjrtClient>(path, name, cpu_devices)
                           : std::make_unique<PjrtClient>(path, name, topology);
          for (size_t i = 0; i < pl->client->num_devices(); ++i)
            pl->allocators.push_back(std::make_unique<XlaAllocator>(pl->client.get(), int(i)));
        } catch (const std::exception& e) {
          pl->error = e.what();
        }
      }
    }
    if (!pl->client && throw_on_error) TESSERA_FAIL(pl->error);
    return *pl;
  }

  Platform& platform(const Device& d) {
    const std::string name = type_ == DeviceType::tpu ? "tpu" : d.platform;
    Platform& p = load(name, true);
    TESSERA_CHECK(d.index >= 0 && size_t(d.index) < p.client->num_devices(), "[device] ", d.str(),
                  " is out of range: the ", name, " plugin has ", p.client->num_devices(),
                  " device(s)");
    return p;
  }
  PjrtClient& client(const Device& d) { return *platform(d).client; }

  void fallback(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs);
  void track(PjrtClient& c, PJRT_Event* e) {
    if (!e) return;
    pending_.push_back(e);
    if (pending_.size() >= 256) {  // bound the list: the oldest half has long finished
      std::vector<PJRT_Event*> old(pending_.begin(), pending_.begin() + 128);
      pending_.erase(pending_.begin(), pending_.begin() + 128);
      for (PJRT_Event* o : old) c.await(o, "an executable");
    }
  }

  struct Entry {
    std::shared_ptr<PjrtExecutable> exe;  // null: no lowering, run through the fallback
    std::vector<int> byte_params;         // per param: which input (>= 0) or ~output (< 0)
    std::vector<size_t> out_bytes;        // per result: its storage's bytes
    std::vector<int> donated;             // params whose buffer a result reuses
  };

  DeviceType type_;
  mutable std::vector<Platform> platforms_;
  std::vector<PJRT_Event*> pending_;
  std::unordered_map<std::string, Entry> cache_;
  std::map<PjrtClient*, std::unordered_map<std::string, std::shared_ptr<PjrtExecutable>>> modules_;
};

void XlaAllocator::deallocate(void* p, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes -= int64_t(bytes);
  }
  Block* b = static_cast<Block*>(p);
  if (b->buf) b->client->destroy(b->buf);
  for (PJRT_Buffer* s : b->shards) b->client->destroy(s);
  b->drop_copies();
  delete b;
}

std::shared_ptr<PjrtExecutable> XlaBackend::compile_or_load(PjrtClient& c, const std::string& text,
                                                            int64_t ops, int partitions) {
  const std::string dir = compile_cache_dir();
  const std::string options =
      partitions > 1 ? PjrtClient::compile_options(partitions, c.mesh_device_ids(partitions))
                     : PjrtClient::compile_options();
  const std::string path =
      dir.empty() ? "" : xla::executable_cache_path(dir, c.identity(), options, text);
  const bool aot = compile_only();
  if (!path.empty() && !c.compile_only()) {
    std::string bytes;
    if (xla::load_cached_executable(path, c.identity(), options, text, &bytes)) {
      try {
        auto exe = c.deserialize(bytes);
        std::lock_guard<std::mutex> lock(g_stats_mu);
        g_stats.disk_hits++;
        if (!aot) return exe;  // compile-only compiles again to report time and memory
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[xla] ignoring the cached executable %s: %s; compiling again\n",
                     path.c_str(), e.what());
        std::lock_guard<std::mutex> lock(g_stats_mu);
        g_stats.disk_rejected++;
      }
    } else if (std::filesystem::exists(path)) {
      std::lock_guard<std::mutex> lock(g_stats_mu);
      g_stats.disk_rejected++;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto exe = c.compile(text, partitions);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.plugin_compiles++;
  }
  std::string bytes;
  if (!path.empty() || aot) bytes = c.serialize(*exe);
  if (!path.empty()) {
    xla::store_cached_executable(path, c.identity(), options, text, bytes);
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.disk_writes++;
  }
  if (aot) {
    XlaAotProgram r;
    r.platform = c.platform();
    r.target = (c.compile_only() ? c.topology_name() + " (" : std::string("(")) +
               std::to_string(c.target_devices()) + " x " + c.device_kind() + ")";
    r.partitions = partitions;
    r.ops = ops;
    r.compile_seconds = secs;
    xla::CompiledMemory m;
    r.has_memory = c.memory(*exe, &m);
    r.argument_bytes = m.arguments;
    r.output_bytes = m.outputs;
    r.alias_bytes = m.aliased;
    r.temp_bytes = m.temporaries;
    r.code_bytes = m.code;
    r.peak_bytes = m.peak;
    r.cache_file = path;
    r.serialized_bytes = int64_t(bytes.size());
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_aot_programs.push_back(r);
  }
  return exe;
}

void add_view_key(std::string& k, const Tensor& t) {
  k += dtype_name(t.dtype());
  k += shape_str(t.shape());
  k += '/';
  for (int64_t s : t.strides()) k += std::to_string(s) + ",";
  k += '@' + std::to_string(t.offset()) + '#' + std::to_string(t.storage()->nbytes()) + ';';
}

bool XlaBackend::view_value(Hlo& h, const Tensor& t, const Val& bytes, Val& out) {
  const DType dt = t.dtype();
  const std::string et = xla::element_type(dt);
  const int64_t es = int64_t(dtype_size(dt));
  const Shape& shape = t.shape();
  const Strides& st = t.strides();
  if (t.numel() == 0) {
    out = h.splat(0.0, shape, et);
    return true;
  }
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (st[i] < 0) return false;
    extent += (shape[i] - 1) * st[i];
  }
  // Bytes of [offset, offset + extent) as `extent` elements of the dtype.
  Val b = h.slice(bytes, {t.offset() * es}, {(t.offset() + extent) * es});
  Val flat;
  if (dt == DType::boolean)
    flat = h.compare("NE", b, h.splat(0.0, b.shape, "ui8"));
  else if (es == 1)
    flat = h.bitcast(b, {extent}, et);
  else
    flat = h.bitcast(h.reshape(b, {extent, es}), {extent}, et);
  // Dims that index memory (size > 1, stride > 0), outermost (largest stride) first; each must
  // nest inside the previous one's stride (views of contiguous memory do).
  std::vector<size_t> dims;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1 && st[i] > 0) dims.push_back(i);
  std::stable_sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return st[a] > st[b]; });
  for (size_t k = 0; k + 1 < dims.size(); ++k)
    if (st[dims[k]] < shape[dims[k + 1]] * st[dims[k + 1]]) return false;
  Val cur = flat;  // [extent]
  Shape lead;      // dims split off so far
  int64_t len = extent;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int64_t n = shape[dims[k]], s = st[dims[k]];
    // cur is lead + [len]: take n rows of stride s.
    if (len < n * s) {
      Shape lo(lead.size() + 1, 0), hi(lead.size() + 1, 0);
      hi.back() = n * s - len;
      cur = h.pad(cur, h.constant(0.0, cur.et), lo, hi);
    } else if (len > n * s) {
      std::vector<int64_t> start(lead.size() + 1, 0), limit = lead;
      limit.push_back(n * s);
      cur = h.slice(cur, start, limit);
    }
    lead.push_back(n);
    Shape ns = lead;
    ns.push_back(s);
    cur = h.reshape(cur, ns);
    len = s;
  }
  {  // the element at offset 0 of the innermost run
    std::vector<int64_t> start(lead.size() + 1, 0), limit = lead;
    limit.push_back(1);
    cur = h.reshape(h.slice(cur, start, limit), lead);
  }
  // lead is in stride order: transpose back to logical order, then broadcast the other dims.
  std::vector<size_t> order = dims;
  std::vector<int64_t> perm(dims.size());
  std::vector<size_t> by_logical = dims;
  std::sort(by_logical.begin(), by_logical.end());
  for (size_t i = 0; i < by_logical.size(); ++i)
    perm[i] = int64_t(std::find(order.begin(), order.end(), by_logical[i]) - order.begin());
  cur = h.transpose(cur, perm);
  std::vector<int64_t> bdims(by_logical.begin(), by_logical.end());
  out = h.broadcast_in_dim(cur, shape, bdims);
  if (out.shape == cur.shape) out = cur;
  return true;
}

Val XlaBackend::to_bytes(Hlo& h, const Val& v, DType dt) {
  const int64_t n = shape_numel(v.shape), es = int64_t(dtype_size(dt));
  Val r = h.reshape(v, {n});
  if (dt == DType::boolean)
    return h.convert(xla::convert_dtype(h, r, DType::boolean, DType::i32), "ui8");
  if (es == 1) return h.bitcast(r, {n}, "ui8");
  return h.reshape(h.bitcast(r, {n, es}, "ui8"), {n * es});
}

// A deferred segment or compiled program as one executable (decision 0033): every step's
// lowering in one module, values as SSA values, external inputs and constants as parameters,
// the values that outlive the plan as results. Compiled per external signature (storage sizes
// and view offsets), so replays with the same weights reuse it.
class XlaGraph final : public GraphKernel {
 public:
  XlaGraph(XlaBackend& be, std::vector<GraphStep> steps, std::vector<char> live)
      : be_(be), steps_(std::move(steps)), live_(std::move(live)) {}

  // Whether every step lowers (checked once with the recorded views).
  bool lowerable() { return build(nullptr, nullptr, nullptr) != nullptr; }

  void run(const std::vector<std::shared_ptr<Storage>>& ext, const std::vector<int64_t>* ext_off,
           std::vector<std::shared_ptr<Storage>>& values) override {
    std::string key;
    // SPMD (decision 0060): an input split over devices makes the program one over as many.
    // Constants (compiled mode's captured weights) may be split too; they never change.
    int parts = 1;
    auto note_parts = [&parts](const Storage& s) {
      const int n = int(s.sharding->spec.parts);
      TESSERA_CHECK(parts == 1 || parts == n, "[xla] one program reads tensors split over ",
                    parts, " and over ", n, " devices");
      parts = n;
    };
    for (const GraphStep& st : steps_)
      for (size_t j = 0; j < st.ins.size(); ++j)
        if (st.in_value[j] < 0 && st.in_ext[j] < 0 && st.ins[j].impl()->storage &&
            st.ins[j].impl()->storage->sharding)
          note_parts(*st.ins[j].impl()->storage);
    for (const auto& s : ext) {
      key += std::to_string(s ? s->nbytes() : 0) + ',';
      if (!s || !s->sharding) continue;
      note_parts(*s);
      // The program rebuilds the whole tensor from the pieces: its layout is part of the key.
      const StorageSharding& sp = *s->sharding;
      key += 's' + std::to_string(sp.spec.dim) + '/' + std::to_string(sp.spec.parts) +
             dtype_name(sp.dtype) + shape_str(sp.shape);
      for (int64_t b : sp.spec.packed) key += '+' + std::to_string(b);
    }
    if (ext_off)
      for (int64_t o : *ext_off) key += std::to_string(o) + ';';
    // External inputs sharing a storage are one parameter. A storage referenced only by `ext`
    // (the executor's own handles: no tensor, pending output or program holds it) is dead
    // after this run, so its buffer is donated to a result of its size (decision 0050).
    Sharing sh;
    sh.first.resize(ext.size());
    sh.dead.assign(ext.size(), 0);
    for (size_t e = 0; e < ext.size(); ++e) {
      sh.first[e] = int64_t(e);
      for (size_t j = 0; j < e; ++j)
        if (ext[j] == ext[e]) {
          sh.first[e] = int64_t(j);
          break;
        }
      if (sh.first[e] != int64_t(e) || !ext[e]) continue;
      const long uses = long(std::count(ext.begin(), ext.end(), ext[e]));
      // SPMD programs donate nothing (each device's copy would have to be given up).
      sh.dead[e] = donation_on() && parts == 1 && ext[e].use_count() == uses;
    }
    for (size_t e = 0; e < ext.size(); ++e)
      key += std::to_string(sh.first[e]) + (sh.dead[e] ? "d" : "") + ' ';
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      auto c = build(&ext, ext_off, &key, &sh, parts);
      TESSERA_CHECK(c, "[xla] a segment stopped lowering");
      it = cache_.emplace(key, std::move(*c)).first;
    } else {
      std::lock_guard<std::mutex> lock(g_stats_mu);
      g_stats.graph_hits++;
    }
    Compiled& c = it->second;
    const Device dev = c.device;
    if (compile_only()) {  // compiled (and cached); its results are storages without data
      for (size_t q = 0; q < c.out_values.size(); ++q)
        values[size_t(c.out_values[q])] = Storage::allocate(c.out_bytes[q], dev);
      return;
    }
    PjrtClient& cl = be_.client_of(dev);
    if (c.parts > 1) {
      run_spmd(c, cl, ext, values);
      return;
    }
    std::vector<PJRT_Buffer*> args;
    for (const Param& p : c.params) {
      const Storage& s =
          p.ext >= 0 ? *ext[size_t(p.ext)] : *steps_[size_t(p.step)].ins[size_t(p.input)].storage();
      Block& b = block_of(s);
      if (!b.buf) {
        std::vector<char> zeros(b.nbytes, 0);
        b.buf = cl.upload_bytes(zeros.data(), zeros.size(), b.device);
      }
      args.push_back(b.buf);
    }
    PJRT_Event* done = nullptr;
    std::vector<PJRT_Buffer*> res = cl.execute(*c.exe, args, c.out_bytes, c.donated, &done);
    be_.track_event(cl, done);
    for (size_t q = 0; q < res.size(); ++q) {
      auto st = Storage::allocate(c.out_bytes[q], dev);
      block_of(*st).buf = res[q];
      values[size_t(c.out_values[q])] = std::move(st);
    }
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.graph_runs++;
  }

 private:
  struct Param {
    int64_t ext = -1;               // an external input, or
    int64_t step = -1, input = -1;  // a constant of a step
  };
  struct Compiled;

  // One SPMD program over c.parts devices from c.device: device r gets its piece of each split
  // input and its copy of every other one (copied there once, then kept with the storage);
  // every result is replicated, so device 0's is the storage's buffer and the others' are kept
  // as its copies for the next program.
  void run_spmd(const Compiled& c, PjrtClient& cl, const std::vector<std::shared_ptr<Storage>>& ext,
                std::vector<std::shared_ptr<Storage>>& values) {
    const int first = c.device.index;
    std::vector<std::vector<PJRT_Buffer*>> args(size_t(c.parts));
    for (const Param& p : c.params) {
      const Storage& s =
          p.ext >= 0 ? *ext[size_t(p.ext)] : *steps_[size_t(p.step)].ins[size_t(p.input)].storage();
      Block& b = block_of(s);
      if (s.sharding) {
        TESSERA_CHECK(b.shards.size() == size_t(c.parts), "[xla] a tensor split over ",
                      c.parts, " devices holds no data (it was never written)");
        for (int r = 0; r < c.parts; ++r) args[size_t(r)].push_back(b.shards[size_t(r)]);
        continue;
      }
      if (!b.buf) {
        std::vector<char> zeros(b.nbytes, 0);
        b.buf = cl.upload_bytes(zeros.data(), zeros.size(), b.device);
      }
      for (int r = 0; r < c.parts; ++r) {
        const int dev = first + r;
        if (dev == b.device) {
          args[size_t(r)].push_back(b.buf);
          continue;
        }
        auto it = b.copies.find(dev);
        if (it == b.copies.end()) it = b.copies.emplace(dev, cl.copy_to_device(b.buf, dev)).first;
        args[size_t(r)].push_back(it->second);
      }
    }
    std::vector<PJRT_Event*> done;
    auto res = cl.execute_spmd(*c.exe, args, c.out_bytes, {}, &done);
    for (PJRT_Event* e : done) be_.track_event(cl, e);
    for (size_t q = 0; q < c.out_values.size(); ++q) {
      auto st = Storage::allocate(c.out_bytes[q], c.device);
      Block& b = block_of(*st);
      b.buf = res[0][q];
      for (int r = 1; r < c.parts; ++r) b.copies[first + r] = res[size_t(r)][q];
      values[size_t(c.out_values[q])] = std::move(st);
    }
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.graph_runs++;
    g_stats.spmd_runs++;
  }

  // A split storage's parameter ([parts, local shape]: device r holds piece r of the ShardSpec)
  // as the whole tensor: each packed block's pieces are moved back next to each other along the
  // split dim. An unpacked split is also annotated with its tiling, the TP plan's layout, for
  // XLA's partitioner.
  static Val whole_from_pieces(Hlo& h, const Val& pieces, const StorageSharding& sh) {
    const int64_t n = sh.spec.parts;
    Val t = pieces;
    const Shape nl = pieces.shape;
    const size_t d = size_t(sh.spec.dim), rank = sh.shape.size();
    const std::vector<int64_t> blocks =
        sh.spec.packed.empty() ? std::vector<int64_t>{sh.shape[d]} : sh.spec.packed;
    std::vector<Val> whole_blocks;
    int64_t off = 0;
    for (int64_t blk : blocks) {
      const int64_t piece = blk / n;
      std::vector<int64_t> start(rank + 1, 0), limit = nl;
      start[d + 1] = off;
      limit[d + 1] = off + piece;
      Val v = blocks.size() == 1 ? t : h.slice(t, start, limit);
      std::vector<int64_t> perm;  // [dims before d, the piece index, dims from d]
      for (size_t i = 0; i < d; ++i) perm.push_back(int64_t(i + 1));
      perm.push_back(0);
      for (size_t i = d; i < rank; ++i) perm.push_back(int64_t(i + 1));
      v = h.transpose(v, perm);
      Shape ws = sh.shape;
      ws[d] = blk;
      whole_blocks.push_back(h.reshape(v, ws));
      off += piece;
    }
    Val whole = whole_blocks.size() == 1 ? whole_blocks[0] : h.concat(whole_blocks, int64_t(d));
    if (blocks.size() == 1) whole = h.annotate_sharding(whole, tile_sharding(rank, d, n));
    return whole;
  }
  // `view` of a split storage's whole tensor `whole`.
  static bool whole_view(Hlo& h, const Val& whole, const StorageSharding& split,
                         const Tensor& view, Val& v) {
    if (view.offset() == 0 && view.is_contiguous() && view.dtype() == split.dtype &&
        view.numel() == shape_numel(split.shape)) {
      v = h.reshape(whole, view.shape());
      return true;
    }
    return XlaBackend::view_value(h, view, XlaBackend::to_bytes(h, whole, split.dtype), v);
  }
  // A split storage's parameter: [parts, local shape] of its dtype, split along dim 0 (device r
  // passes its piece, a [1, local shape] buffer).
  static Val split_param(Hlo& h, const StorageSharding& split) {
    const Shape dims = piece_dims(split);
    Shape global = dims;
    global[0] = split.spec.parts;
    const Val p = h.param(global, xla::element_type(split.dtype));
    h.shard_param(p, tile_sharding(global.size(), 0, split.spec.parts));
    return p;
  }
  struct Compiled {
    std::shared_ptr<PjrtExecutable> exe;
    std::vector<Param> params;
    std::vector<int64_t> out_values;
    std::vector<size_t> out_bytes;
    std::vector<int> donated;  // params whose buffer a result reuses
    Device device;
    int parts = 1;  // SPMD: devices from `device` the program is split over
  };
  // Per external input: the first input of its storage, and whether that storage is dead.
  struct Sharing {
    std::vector<int64_t> first;
    std::vector<char> dead;
  };

  // The module for these external storages (null: only check that every step lowers).
  std::unique_ptr<Compiled> build(const std::vector<std::shared_ptr<Storage>>* ext,
                                  const std::vector<int64_t>* ext_off, const std::string* key,
                                  const Sharing* sh = nullptr, int parts = 1) {
    auto c = std::make_unique<Compiled>();
    c->parts = parts;
    Hlo h;
    h.set_partitions(parts);
    std::map<int64_t, Val> ext_bytes;
    std::map<int64_t, Val> ext_whole;  // split storages: the whole tensor
    std::map<int64_t, Val> vals;  // value -> its typed value
    std::map<int64_t, DType> vdt;
    for (size_t si = 0; si < steps_.size(); ++si) {
      const GraphStep& s = steps_[si];
      std::vector<Val> in;
      std::vector<DType> dts;
      for (size_t j = 0; j < s.ins.size(); ++j) {
        Tensor view = s.ins[j];
        Val v;
        if (s.in_value[j] >= 0) {
          const int64_t val = s.in_value[j];
          auto it = vals.find(val);
          if (it == vals.end()) return nullptr;
          const Val& src = it->second;
          const bool whole = view.offset() == 0 && view.is_contiguous() &&
                             view.numel() == shape_numel(src.shape) && view.dtype() == vdt[val];
          if (whole) {
            v = h.reshape(src, view.shape());
          } else if (!XlaBackend::view_value(h, view, XlaBackend::to_bytes(h, src, vdt[val]), v)) {
            return nullptr;
          }
        } else {
          Val bytes;
          if (s.in_ext[j] >= 0) {
            const int64_t e = s.in_ext[j];
            auto impl = std::make_shared<TensorImpl>(*view.impl());
            if (ext_off) impl->offset += (*ext_off)[size_t(e)];
            view = Tensor(impl);
            const int64_t rep = sh ? sh->first[size_t(e)] : e;  // one parameter per storage
            const StorageSharding* split = ext ? (*ext)[size_t(e)]->sharding.get() : nullptr;
            auto it = ext_bytes.find(rep);
            if (it == ext_bytes.end()) {
              const int64_t n = ext ? int64_t((*ext)[size_t(e)]->nbytes())
                                    : (view.offset() + 1) * int64_t(dtype_size(view.dtype())) +
                                          extent_bytes(view);
              it = ext_bytes.emplace(rep, split ? split_param(h, *split) : h.param({n}, "ui8"))
                       .first;
              c->params.push_back({rep, -1, -1});
              if (split) ext_whole[rep] = whole_from_pieces(h, it->second, *split);
            }
            bytes = it->second;
            if (split) {
              if (!whole_view(h, ext_whole[rep], *split, view, v)) return nullptr;
              in.push_back(v);
              dts.push_back(view.dtype());
              continue;
            }
          } else {
            if (!view.impl()->storage) return nullptr;
            c->params.push_back({-1, int64_t(si), int64_t(j)});
            if (const StorageSharding* split = view.impl()->storage->sharding.get()) {
              const Val whole = whole_from_pieces(h, split_param(h, *split), *split);
              if (!whole_view(h, whole, *split, view, v)) return nullptr;
              in.push_back(v);
              dts.push_back(view.dtype());
              continue;
            }
            bytes = h.param({int64_t(view.impl()->storage->nbytes())}, "ui8");
          }
          if (!XlaBackend::view_value(h, view, bytes, v)) return nullptr;
        }
        in.push_back(v);
        dts.push_back(view.dtype());
      }
      std::vector<TensorSpec> specs;
      for (const Tensor& o : s.outs) specs.push_back({o.shape(), o.dtype()});
      std::vector<Val> res;
      if (!xla::lower(h, *s.prim, in, dts, specs, res)) return nullptr;
      for (size_t q = 0; q < res.size(); ++q) {
        vals[s.out_value[q]] = res[q];
        vdt[s.out_value[q]] = specs[q].dtype;
      }
      c->device = s.outs.empty() ? c->device : s.outs[0].device();
    }
    if (!ext) return c;  // only checking
    std::vector<Val> rets;
    for (const auto& [v, val] : vals) {
      if (!live_[size_t(v)]) continue;
      rets.push_back(XlaBackend::to_bytes(h, val, vdt[v]));
      c->out_values.push_back(v);
      c->out_bytes.push_back(size_t(shape_numel(val.shape)) * dtype_size(vdt[v]));
    }
    // Each dead external storage gives its buffer to a result of the same size.
    std::vector<std::pair<size_t, size_t>> aliases;
    std::vector<char> result_taken(rets.size(), 0);
    for (size_t pi = 0; sh && pi < c->params.size(); ++pi) {
      const Param& p = c->params[pi];
      if (p.ext < 0 || !sh->dead[size_t(p.ext)]) continue;
      const size_t n = (*ext)[size_t(p.ext)]->nbytes();
      for (size_t q = 0; q < rets.size(); ++q)
        if (!result_taken[q] && c->out_bytes[q] == n) {
          result_taken[q] = 1;
          aliases.push_back({pi, q});
          c->donated.push_back(int(pi));
          break;
        }
    }
    const std::string text = h.module(rets, aliases);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->exe = be_.compile(be_.client_of(c->device), text, int64_t(steps_.size()), parts);
    } catch (const std::exception& ex) {
      std::lock_guard<std::mutex> lock(g_stats_mu);
      g_last_module = text;
      throw;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.graph_compiles++;
    g_stats.compile_seconds += secs;
    (void)key;
    return c;
  }

  static int64_t extent_bytes(const Tensor& t) {
    int64_t e = 1;
    for (size_t i = 0; i < t.shape().size(); ++i) e += (t.shape()[i] - 1) * t.strides()[i];
    return e * int64_t(dtype_size(t.dtype()));
  }

  XlaBackend& be_;
  std::vector<GraphStep> steps_;
  std::vector<char> live_;
  std::unordered_map<std::string, Compiled> cache_;
};

std::unique_ptr<GraphKernel> XlaBackend::prepare_graph(const std::vector<GraphStep>& steps,
                                                       const std::vector<char>& live_out) {
  if (!env::flag(EnvVar::xla_graphs)) return nullptr;
  for (const GraphStep& s : steps)
    for (const Tensor& t : s.ins)
      if (t.numel() == 0) return nullptr;
  auto g = std::make_unique<XlaGraph>(*this, steps, live_out);
  if (!g->lowerable()) return nullptr;  // some op falls back: run the plan op by op
  return g;
}

void XlaBackend::run(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) {
  const Device& d = outs.empty() ? ins.at(0).device() : outs[0].device();
  PjrtClient& c = client(d);
  for (const std::vector<Tensor>* ts : {&ins, const_cast<const std::vector<Tensor>*>(&outs)})
    for (const Tensor& t : *ts)
      TESSERA_CHECK(!t.defined() || !t.storage()->sharding, "[xla] ", p.name(), " on ", d.str(),
                    " reads a tensor split over ", t.defined() && t.storage()->sharding
                        ? t.storage()->sharding->spec.parts : 0,
                    " devices (SPMD tensor parallelism): SPMD runs whole programs only, in "
                    "compiled mode (--mode compile, compile() or compile_repeated_blocks()); "
                    "strict eager does not run it");
  if (compile_only()) {  // only programs are compiled ahead of time; an eager op has no data
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.aot_skipped_ops++;
    return;
  }
  // The key: primitive, attributes, every view (dtype, shape, strides, offset, storage size).
  Hasher ah;
  p.hash_attributes(ah);
  std::string key = std::string(p.name()) + '|' + std::to_string(ah.value()) + '|';
  for (const Tensor& t : ins) {
    if (t.defined())
      add_view_key(key, t);
    else
      key += "-;";
  }
  key += "->";
  for (const Tensor& t : outs) add_view_key(key, t);
  // One parameter per distinct storage (a buffer passed twice could not be donated), and
  // whether each output's storage holds bytes already: those bytes are replaced by the result,
  // so their buffer is donated to it (written in place, decision 0050).
  std::vector<const Storage*> st;
  for (const Tensor& t : ins) st.push_back(t.defined() ? t.storage().get() : nullptr);
  for (const Tensor& t : outs) st.push_back(t.storage().get());
  std::vector<int> first(st.size());
  for (size_t i = 0; i < st.size(); ++i) {
    first[i] = int(i);
    for (size_t j = 0; j < i; ++j)
      if (st[i] && st[j] == st[i]) {
        first[i] = int(j);
        break;
      }
    key += std::to_string(first[i]) + ',';
  }
  const bool donate = donation_on();
  for (const Tensor& t : outs) key += donate && block_of(*t.storage()).buf ? 'w' : 'n';

  auto it = cache_.find(key);
  if (it == cache_.end()) {
    Entry e;
    Hlo h;
    std::vector<Val> vals;
    std::vector<DType> dts;
    std::vector<TensorSpec> specs;
    std::map<int, Val> param_of;  // first tensor of a storage -> its bytes parameter
    std::map<int, size_t> param_index;
    auto bytes_param = [&](int k, int64_t nbytes, int tensor) {
      auto pit = param_of.find(first[size_t(k)]);
      if (pit != param_of.end()) return pit->second;
      param_index[first[size_t(k)]] = e.byte_params.size();
      e.byte_params.push_back(tensor);
      return param_of[first[size_t(k)]] = h.param({nbytes}, "ui8");
    };
    bool ok = true;
    for (size_t i = 0; i < ins.size() && ok; ++i) {
      if (!ins[i].defined()) {
        ok = false;
        break;
      }
      Val bytes = bytes_param(int(i), int64_t(ins[i].storage()->nbytes()), int(i));
      Val v;
      ok = view_value(h, ins[i], bytes, v);
      vals.push_back(v);
      dts.push_back(ins[i].dtype());
    }
    for (const Tensor& t : outs) specs.push_back({t.shape(), t.dtype()});
    std::vector<Val> results;
    ok = ok && xla::lower(h, p, vals, dts, specs, results);
    std::vector<std::pair<size_t, size_t>> aliases;
    if (ok) {
      std::vector<Val> rets;
      for (size_t q = 0; q < outs.size(); ++q) {
        const Tensor& o = outs[q];
        const int64_t n = o.numel(), es = int64_t(dtype_size(o.dtype()));
        const int k = int(ins.size() + q);
        Val b = to_bytes(h, results[q], o.dtype());
        const int64_t sb = int64_t(o.storage()->nbytes());
        const bool part = o.offset() != 0 || n * es != sb;
        if (part) {  // a part of its storage: update the old bytes
          Val old = bytes_param(k, sb, ~int(q));
          b = h.dynamic_update_slice(old, b, {o.offset() * es});
        }
        // The storage's old bytes (read as an input, updated, or only overwritten) give their
        // buffer to the result: the one buffer of that storage is replaced by it anyway.
        if (donate && (part || block_of(*o.storage()).buf)) {
          bytes_param(k, sb, ~int(q));
          const size_t pi = param_index[first[size_t(k)]];
          bool taken = false;
          for (const auto& a : aliases) taken = taken || a.first == pi;
          if (!taken) {
            aliases.push_back({pi, q});
            e.donated.push_back(int(pi));
          }
        }
        rets.push_back(b);
        e.out_bytes.push_back(size_t(sb));
      }
      const std::string text = h.module(rets, aliases);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        e.exe = compile(c, text);
      } catch (const std::exception& ex) {
        {
          std::lock_guard<std::mutex> lock(g_stats_mu);
          g_last_module = text;
        }
        TESSERA_FAIL("[xla] ", p.name(), ": ", ex.what());
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lock(g_stats_mu);
      g_stats.compiles++;
      g_stats.compile_seconds += secs;
      g_last_module = text;
    }
    it = cache_.emplace(std::move(key), std::move(e)).first;
  } else {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.cache_hits++;
  }
  const Entry& e = it->second;
  if (!e.exe) {
    fallback(p, ins, outs);
    return;
  }
  std::vector<PJRT_Buffer*> args;
  for (int bp : e.byte_params) {
    const Storage& s = bp >= 0 ? *ins[size_t(bp)].storage() : *outs[size_t(~bp)].storage();
    Block& b = block_of(s);
    if (!b.buf) {  // never written: zeros
      std::vector<char> zeros(b.nbytes, 0);
      b.buf = c.upload_bytes(zeros.data(), zeros.size(), b.device);
    }
    args.push_back(b.buf);
  }
  PJRT_Event* done = nullptr;
  std::vector<PJRT_Buffer*> res = c.execute(*e.exe, args, e.out_bytes, e.donated, &done);
  track(c, done);
  for (size_t q = 0; q < outs.size(); ++q) block_of(*outs[q].storage()).set(res[q]);
  std::lock_guard<std::mutex> lock(g_stats_mu);
  g_stats.executions++;
}

// No lowering: the CPU runs the op on host copies of the inputs (decision 0032).
void XlaBackend::fallback(Primitive& p, const std::vector<Tensor>& ins, std::vector<Tensor>& outs) {
  std::string dts;
  for (const Tensor& t : ins)
    dts += std::string(dts.empty() ? "" : ", ") + (t.defined() ? dtype_name(t.dtype()) : "none");
  TESSERA_CHECK(env::flag(EnvVar::xla_fallback), "[xla] no StableHLO lowering for ", p.name(),
                " on (", dts, "); TESSERA_XLA_FALLBACK=1 runs it on the CPU through host copies");
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats.fallbacks[p.name()]++;
  }
  std::vector<Tensor> hin;
  for (const Tensor& t : ins) {
    if (!t.defined()) {
      hin.push_back(t);
      continue;
    }
    auto st = Storage::allocate(t.storage()->nbytes(), Device::cpu());
    copy_to_host(*t.storage(), 0, st->data(), st->nbytes());
    auto impl = std::make_shared<TensorImpl>(*t.impl());
    impl->storage = st;
    impl->pending.reset();
    impl->device = Device::cpu();
    hin.emplace_back(std::move(impl));
  }
  std::vector<Tensor> hout;
  for (const Tensor& o : outs) hout.push_back(Tensor::empty(o.shape(), o.dtype()));
  p.eval_cpu(hin, hout);
  for (size_t q = 0; q < outs.size(); ++q)
    copy_from_host(hout[q].raw_data(), *outs[q].storage(),
                   size_t(outs[q].offset()) * dtype_size(outs[q].dtype()), hout[q].nbytes());
}

}  // namespace

std::unique_ptr<Backend> make_xla_backend(DeviceType type) {
  return std::make_unique<XlaBackend>(type);
}

XlaStats xla_stats() {
  XlaStats s;
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    s = g_stats;
  }
  const auto b = xla::PjrtClient::buffer_bytes();
  s.live_bytes = b.live;
  s.peak_bytes = b.peak;
  s.donated_bytes = b.donated;
  s.live_buffers = b.buffers;
  return s;
}
void reset_xla_stats() {
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    g_stats = XlaStats();
  }
  xla::PjrtClient::reset_buffer_stats();
}
void set_xla_donation(bool on) {
  g_donate = on ? 1 : 0;
}
int64_t xla_plugin_bytes_in_use(const Device& d) {
  TESSERA_CHECK(d.type == DeviceType::xla || d.type == DeviceType::tpu, "[xla] ", d.str(),
                " is not an XLA device");
  auto& be = backend_for(d);
  return static_cast<XlaBackend&>(be).client_of(d).plugin_bytes_in_use(d.index);
}
std::string xla_last_module() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  return g_last_module;
}
void set_xla_compile_only(bool on, const std::string& tpu_topology) {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  g_compile_only = on;
  g_tpu_topology = tpu_topology;
  if (on) g_aot_programs.clear();
}
bool xla_compile_only() { return compile_only(); }
std::vector<XlaAotProgram> xla_aot_programs() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  return g_aot_programs;
}

}  // namespace tessera
