#pragma once
// The caching allocator of every buffer the library allocates in a step: tensors' local slices,
// temporaries, MPI staging and collective buffers, on the device and on the host. A step in steady
// state makes no Kokkos allocation, so on a GPU neither cudaMalloc (plus Kokkos 3.4's blocking
// copy of the allocation's header) nor cudaFree (which waits for the device) runs on the hot path;
// on the CPU glibc no longer hands activations back to the kernel to be page-faulted and zeroed
// anew each step (measured before the pool: 8% of a Transformer step in the kernel).
//
// Blocks are kept per (element type, memory space) and reused by size class: up to 64 KiB the
// next power of two (at least 64 bytes), above it four classes per octave (the size rounded up to
// a multiple of a quarter of its power of two: at most 25% unused), so that nearby sizes share
// blocks. A View of n elements handed out is a subview of its block's first n elements: a
// subview shares the block's allocation record, so its reference count is the block's and the
// block is free again when the pool holds its only reference (use_count() == 1). No deleter hook
// is needed, and no tensor can see its memory reused while it or a View copy of it is alive.
// (A block is typed by its element type because the reference count lives in Kokkos's typed
// allocation record; sharing bytes across types would need Kokkos's internal tracker API.)
//
// Reuse is safe without per-stream bookkeeping because Kokkos 3.4 runs every kernel and copy of
// the library on the execution space's one (default) stream: a kernel that writes a reused block
// is queued after every kernel that read its previous contents.
//
// Statistics (memory_stats()): the Kokkos allocations the pool made, bytes held in blocks, bytes
// of live Views handed out and their high-water mark (reset_peak_memory()): the measured memory
// of a step's tensors and buffers. Blocks stay in the pool until release_cached_memory() or
// Kokkos::finalize (a finalize hook), or an allocation fails (then free blocks are dropped and the
// allocation retried). MESHTENSOR_TENSOR_CACHE=0 turns reuse off: every View a fresh allocation
// of its exact size (still counted). Planning makes no allocation (a fake address, plan/ledger.hpp).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../plan/ledger.hpp"

namespace meshtensor {

// What the caching allocator holds and hands out, in bytes (memory_stats()).
struct memory_statistics {
  std::int64_t system_allocations = 0;  // Kokkos allocations the pool made since the program began
  std::int64_t bytes_held = 0;          // in the pool's blocks, in use or free
  std::int64_t bytes_in_use = 0;        // of the Views handed out and still alive
  std::int64_t peak_bytes_in_use = 0;   // the most bytes_in_use since the start or reset_peak_memory()
};

namespace detail {

struct view_pool_base {
  virtual ~view_pool_base() = default;
  virtual void sweep() = 0;                 // takes back the blocks no View refers to any more
  virtual void release(bool in_use) = 0;  // drops free blocks (and the references to used ones)
};

// The pools of every (element type, memory space) and their statistics, under one lock: a sweep
// of all pools before an allocation that could set a new peak keeps the peak exact.
struct view_pools {
  std::mutex mu;
  std::vector<view_pool_base*> all;
  memory_statistics total;
  std::map<std::string, memory_statistics> by_space;  // keyed by the memory space's name
  static view_pools& get() {
    static view_pools p;
    return p;
  }
  void add_in_use(memory_statistics& space, std::int64_t bytes) {
    for (auto* s : {&total, &space}) {
      s->bytes_in_use += bytes;
      s->peak_bytes_in_use = std::max(s->peak_bytes_in_use, s->bytes_in_use);
    }
  }
  void sweep_all() {
    for (auto* q : all) q->sweep();
  }
};

// The block size of `bytes`: see the top of this file.
constexpr std::size_t size_class(std::size_t bytes) {
  constexpr std::size_t small = std::size_t{1} << 16;
  if (bytes <= 64) return 64;
  std::size_t p = 64;
  while (p < bytes && p < small) p <<= 1;
  if (p >= bytes) return p;
  std::size_t octave = small;
  while (octave * 2 <= bytes) octave <<= 1;
  const std::size_t step = octave / 4;
  return (bytes + step - 1) / step * step;
}

template <class T, class Mem>
class view_pool : public view_pool_base {
 public:
  using view_type = Kokkos::View<T*, Mem>;

  static view_pool& get() {
    static view_pool* p = [] {
      auto* q = new view_pool;  // leaked on purpose: Views may outlive static destruction order
      auto& all = view_pools::get();
      {
        std::lock_guard<std::mutex> lock(all.mu);
        all.all.push_back(q);
        q->stats_ = &all.by_space[Mem::name()];
      }
      Kokkos::push_finalize_hook([q] {
        std::lock_guard<std::mutex> lock(view_pools::get().mu);
        q->release(true);
      });
      return q;
    }();
    return *p;
  }

  // A View of n elements, uninitialised (its block's previous contents, or none).
  // Planning: no memory, a fake address (plan/ledger.hpp) that no kernel touches.
  view_type allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (planning()) return view_type(reinterpret_cast<T*>(plan_ledger::get().fake_address(bytes)), n);
    auto& all = view_pools::get();
    std::lock_guard<std::mutex> lock(all.mu);
    // Parameters and optimizer states live across steps: were they to take a block a step's
    // temporaries used, the next step would allocate anew (Adam's moments, made in the first
    // step while its activations were freed, took 5 blocks). They take blocks of their own kind.
    const memory_kind kind = plan_ledger::get().kind();
    const bool lasting = kind == memory_kind::parameters || kind == memory_kind::optimizer_state;
    const std::size_t c = size_class(bytes);
    // Blocks are taken back lazily: this pool is swept only when no free block fits, and every
    // pool only when the bytes counted in use (which still count the blocks that died since the
    // last sweep) would pass the peak, so that the peak stays exact. A sweep before every
    // allocation cost a walk over every live block (hundreds in a step) per op.
    view_type block = enabled_ ? take(c, lasting) : view_type();
    if (enabled_ && !block.data()) {
      sweep();
      block = take(c, lasting);
    }
    const auto b = static_cast<std::int64_t>(bytes);
    if (all.total.bytes_in_use + b > all.total.peak_bytes_in_use ||
        stats_->bytes_in_use + b > stats_->peak_bytes_in_use)
      all.sweep_all();
    if (!block.data()) block = fresh(enabled_ ? (c + sizeof(T) - 1) / sizeof(T) : n);
    busy_.push_back({block, bytes, c, lasting});
    all.add_in_use(*stats_, static_cast<std::int64_t>(bytes));
    if (block.extent(0) == n) return block;
    return view_type(block, std::make_pair(std::size_t{0}, n));
  }

  void sweep() override {
    auto& all = view_pools::get();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < busy_.size(); ++i) {
      if (busy_[i].block.use_count() > 1) {
        if (kept != i) busy_[kept] = std::move(busy_[i]);
        ++kept;
        continue;
      }
      const auto b = static_cast<std::int64_t>(busy_[i].bytes);
      all.total.bytes_in_use -= b;
      stats_->bytes_in_use -= b;
      if (enabled_)
        (busy_[i].lasting ? free_lasting_ : free_)[busy_[i].block_class].push_back(std::move(busy_[i].block));
      else forget(busy_[i].block);
      busy_[i].block = view_type();
    }
    busy_.resize(kept);
  }

  void release(bool in_use) override {
    sweep();
    for (auto* list : {&free_, &free_lasting_}) {
      for (auto& [bytes, blocks] : *list)
        for (auto& b : blocks) forget(b);
      list->clear();
    }
    if (!in_use) return;
    auto& all = view_pools::get();
    for (auto& u : busy_) {
      all.total.bytes_in_use -= static_cast<std::int64_t>(u.bytes);
      stats_->bytes_in_use -= static_cast<std::int64_t>(u.bytes);
      forget(u.block);
    }
    busy_.clear();
  }

 private:
  struct used {
    view_type block;
    std::size_t bytes;       // of the View handed out
    std::size_t block_class;  // the size class of the block (its bytes, where sizeof(T) divides them)
    bool lasting;            // a parameter's or an optimizer state's
  };
  static std::size_t block_bytes(const view_type& b) { return b.extent(0) * sizeof(T); }

  // A free block of size class c: of the caller's kind first, then (a step's buffer only) a
  // lasting one; none where neither list has one.
  view_type take(std::size_t c, bool lasting) {
    for (auto* list : {lasting ? &free_lasting_ : &free_, lasting ? nullptr : &free_lasting_}) {
      if (!list) continue;
      auto it = list->find(c);
      if (it == list->end() || it->second.empty()) continue;
      view_type block = std::move(it->second.back());
      it->second.pop_back();
      return block;
    }
    return view_type();
  }

  // A Kokkos allocation, counted. Where it fails, the free blocks of every pool are dropped and
  // it is tried once more (the caller holds view_pools' lock).
  view_type fresh(std::size_t n) {
    view_type v;
    try {
      v = view_type(Kokkos::view_alloc(std::string("meshtensor::tensor"), Kokkos::WithoutInitializing), n);
    } catch (const std::exception&) {
      for (auto* q : view_pools::get().all) q->release(false);
      v = view_type(Kokkos::view_alloc(std::string("meshtensor::tensor"), Kokkos::WithoutInitializing), n);
    }
    const auto b = static_cast<std::int64_t>(block_bytes(v));
    for (auto* s : {&view_pools::get().total, stats_}) {
      ++s->system_allocations;
      s->bytes_held += b;
    }
    return v;
  }
  // Stops counting b as held (its memory goes when its last View does).
  void forget(view_type& b) {
    const auto bytes = static_cast<std::int64_t>(block_bytes(b));
    view_pools::get().total.bytes_held -= bytes;
    stats_->bytes_held -= bytes;
    b = view_type();
  }

  // Free blocks by size class: a step's, and parameters' and optimizer states'.
  std::unordered_map<std::size_t, std::vector<view_type>> free_, free_lasting_;
  std::vector<used> busy_;                                         // blocks handed out
  memory_statistics* stats_ = nullptr;                             // of Mem
  bool enabled_ = [] {
    const char* e = std::getenv("MESHTENSOR_TENSOR_CACHE");
    return !(e && std::string(e) == "0");
  }();
};

// A temporary buffer from the pool (a product's permuted operand, a kernel's partial sums), counted
// in a plan's memory as a tensor would be while it lives.
template <class T, class Mem>
struct temporary_view {
  Kokkos::View<T*, Mem> v;
  std::shared_ptr<void> planned_bytes;
  explicit temporary_view(std::size_t n) : v(view_pool<T, Mem>::get().allocate(n)) {
    if (planning()) planned_bytes = plan_ledger::get().claim(v.data(), static_cast<std::int64_t>(n * sizeof(T)));
  }
};

// A plan's claim on pool buffer v's bytes while the handle lives (none when running): for scratch
// that a View alone holds, whose death the ledger cannot see. A buffer a tensor already claimed
// (the same address) is not counted twice.
inline std::shared_ptr<void> planned_claim(const void* data, std::int64_t bytes) {
  if (!planning() || data == nullptr) return nullptr;
  return plan_ledger::get().claim(data, bytes);
}
template <class V>
std::shared_ptr<void> planned_claim(const V& v) {
  return planned_claim(v.data(), static_cast<std::int64_t>(v.extent(0) * sizeof(typename V::value_type)));
}
// An MPI buffer's (mpi_buffer.hpp), by its address: its view() would stage a copy in a real run.
template <class B>
std::shared_ptr<void> planned_claim_of_buffer(const B& b) {
  using T = std::remove_cv_t<std::remove_pointer_t<decltype(b.data())>>;
  return planned_claim(b.data(), static_cast<std::int64_t>(b.size() * sizeof(T)));
}

// A small table (offsets, counts) that the host writes and reads, from the pool; real memory even
// while planning, when a planned run reads it too (then a plain allocation: plans make no step).
template <class T>
Kokkos::View<T*, Kokkos::HostSpace> host_table(std::size_t n) {
  if (planning())
    return Kokkos::View<T*, Kokkos::HostSpace>(Kokkos::view_alloc(std::string("meshtensor::planned_table"), Kokkos::WithoutInitializing), n);
  return view_pool<T, Kokkos::HostSpace>::get().allocate(n);
}

}  // namespace detail

// The caching allocator's statistics over every memory space (blocks of Views alive now are
// taken back first, so bytes_in_use is current).
inline memory_statistics memory_stats() {
  auto& p = detail::view_pools::get();
  std::lock_guard<std::mutex> lock(p.mu);
  p.sweep_all();
  return p.total;
}

// The same for one memory space (e.g. Kokkos::CudaSpace, Kokkos::HostSpace).
template <class Mem>
memory_statistics memory_stats() {
  auto& p = detail::view_pools::get();
  std::lock_guard<std::mutex> lock(p.mu);
  p.sweep_all();
  const auto it = p.by_space.find(Mem::name());
  return it == p.by_space.end() ? memory_statistics{} : it->second;
}

// Starts the high-water mark of bytes in use again from the bytes in use now (e.g. before a step).
inline void reset_peak_memory() {
  auto& p = detail::view_pools::get();
  std::lock_guard<std::mutex> lock(p.mu);
  p.sweep_all();
  p.total.peak_bytes_in_use = p.total.bytes_in_use;
  for (auto& [name, s] : p.by_space) s.peak_bytes_in_use = s.bytes_in_use;
}

// Drops the pool's free blocks (memory still used by tensors stays theirs, and returns to the pool
// when they die).
inline void release_cached_memory() {
  auto& p = detail::view_pools::get();
  std::lock_guard<std::mutex> lock(p.mu);
  for (auto* q : p.all) q->release(false);
}

}  // namespace meshtensor
