#pragma once
// A cache of tensors' local slices, keyed by element count, so that a training step reuses the
// memory of the previous one. Without it every op result is a fresh allocation: glibc serves the
// large ones (activations, 0.1 - 4 MB here) from mmap or trims them off the heap when freed, so
// each step page-faults and the kernel zeroes its activations' pages anew (measured: 8% of a
// Transformer step in the kernel). A cached View is free for reuse when the cache holds its only
// reference (use_count() == 1): no deleter hook, and no tensor can see its memory reused while it
// or a View copy of it is alive. Small slices (below min_bytes) go to the allocator directly.
// The cache is emptied before Kokkos is finalised, or by release_cached_memory(); the environment
// variable MESHTENSOR_TENSOR_CACHE=0 turns it off (every slice a fresh allocation).
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../plan/ledger.hpp"

namespace meshtensor {
namespace detail {

struct view_pool_base {
  virtual ~view_pool_base() = default;
  virtual void release() = 0;
};

// The pools of every (element type, memory space) in use, for release_cached_memory().
struct view_pools {
  std::mutex mu;
  std::vector<view_pool_base*> all;
  static view_pools& get() {
    static view_pools p;
    return p;
  }
};

template <class T, class Mem>
class view_pool : public view_pool_base {
 public:
  using view_type = Kokkos::View<T*, Mem>;
  static constexpr std::size_t min_bytes = std::size_t{1} << 16;
  // Cached bytes above which new sizes are no longer kept (views beyond it are plain allocations).
  static constexpr std::size_t max_bytes = std::size_t{1} << 31;

  static view_pool& get() {
    static view_pool* p = [] {
      auto* q = new view_pool;  // leaked on purpose: Views may outlive static destruction order
      {
        std::lock_guard<std::mutex> lock(view_pools::get().mu);
        view_pools::get().all.push_back(q);
      }
      Kokkos::push_finalize_hook([q] { q->release(); });
      return q;
    }();
    return *p;
  }

  // A View of n elements, uninitialised (its previous contents, or none).
  // Planning: no memory, a fake address (plan/ledger.hpp) that no kernel touches.
  view_type allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (planning()) return view_type(reinterpret_cast<T*>(plan_ledger::get().fake_address(bytes)), n);
    if (bytes < min_bytes || !enabled_) return fresh(n);
    std::lock_guard<std::mutex> lock(mu_);
    auto& bucket = free_[n];
    for (const auto& v : bucket)
      if (v.use_count() == 1) return v;
    view_type v = fresh(n);
    if (held_ + bytes <= max_bytes) {
      bucket.push_back(v);
      held_ += bytes;
    }
    return v;
  }

  void release() override {
    std::lock_guard<std::mutex> lock(mu_);
    free_.clear();
    held_ = 0;
  }

 private:
  static view_type fresh(std::size_t n) {
    return view_type(Kokkos::view_alloc(std::string("meshtensor::tensor"), Kokkos::WithoutInitializing), n);
  }
  std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<view_type>> free_;
  std::size_t held_ = 0;
  bool enabled_ = [] {
    const char* e = std::getenv("MESHTENSOR_TENSOR_CACHE");
    return !(e && std::string(e) == "0");
  }();
};

}  // namespace detail

// Drops the cache's references to tensor memory (memory still used by tensors stays theirs).
inline void release_cached_memory() {
  auto& p = detail::view_pools::get();
  std::lock_guard<std::mutex> lock(p.mu);
  for (auto* q : p.all) q->release();
}

}  // namespace meshtensor
