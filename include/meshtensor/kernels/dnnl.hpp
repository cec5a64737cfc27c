#pragma once
// The oneDNN provider of the kernel door (kernels/launch.hpp), on host execution spaces: bf16
// products (matmul) and direct convolutions (forward, backward data, backward weights). Built in
// where meshtensor::dnnl is linked (MESHTENSOR_HAVE_DNNL=1, CMake option MESHTENSOR_DNNL); without
// it this header declares nothing and the ops take their portable paths.
//
// Primitives are made once per problem and kept in a bounded cache (least recently used out first),
// keyed by the problem's shape, memory strides and data type: a training step asks for the same few
// shapes every step, and making a primitive costs far more than running a small one.
#ifndef MESHTENSOR_HAVE_DNNL
#define MESHTENSOR_HAVE_DNNL 0
#endif

#if MESHTENSOR_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../element/bf16.hpp"
#include "../error.hpp"

namespace meshtensor::kernels::dnnl_provider {

// MESHTENSOR_KERNELS: unset, empty or "auto" uses oneDNN; "portable" turns it off (the portable
// paths: unfold + product, OpenBLAS).
inline bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MESHTENSOR_KERNELS");
    const std::string_view s = v ? v : "";
    if (s.empty() || s == "auto") return true;
    if (s == "portable") return false;
    throw error(meshtensor::detail::cat("meshtensor: MESHTENSOR_KERNELS is '", s, "'; expected auto or portable"));
  }();
  return on;
}

struct context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};
inline context& ctx() {
  static context c;
  return c;
}

// The ISA oneDNN dispatches to on this CPU (for the benchmarks' reports).
inline const char* isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}
// Whether oneDNN dispatches to AVX-512 cores here (read once).
inline bool avx512() {
  static const bool yes = [] {
    const auto isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
           isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return yes;
}
// oneDNN computes bf16 on AVX-512 cores (natively with AVX512_BF16 or AMX, emulated on plain
// AVX-512); below that it has no bf16 convolution.
inline bool has_bf16() { return avx512(); }

// Whether float products go to oneDNN's matmul rather than OpenBLAS's sgemm. On AVX-512 cores its
// brgemm kernels were faster at every shape of a Transformer step (1.07-1.24x, benchmarks/
// bench_bf16.cpp, docs/performance.md), the batched ones most (one call, no packing per matrix, no
// memset of C). Below AVX-512 oneDNN 2.x has no brgemm matmul and OpenBLAS stays. A fixed rule, not
// a per-shape race at run time: every rank must take the same provider, or the replicas of a
// parameter would round differently and drift apart.
inline bool float_products() { return enabled() && avx512(); }

using key_type = std::vector<std::int64_t>;
struct key_hash {
  std::size_t operator()(const key_type& k) const {
    std::size_t h = 1469598103934665603ull;
    for (auto v : k) h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
    return h;
  }
};

// At most `capacity` entries; the least recently used goes first.
template <class V>
class primitive_cache {
 public:
  explicit primitive_cache(std::size_t capacity) : capacity_(capacity) {}
  template <class Make>
  V& get(const key_type& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    order_.emplace_front(key, make());
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_.size();
  }
  template <class F>
  void for_each(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, value] : order_) f(value);
  }

 private:
  std::size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<key_type, V>> order_;
  std::unordered_map<key_type, typename std::list<std::pair<key_type, V>>::iterator, key_hash> index_;
};
inline constexpr std::size_t cache_capacity = 256;

template <class T>
constexpr dnnl::memory::data_type data_type_of() {
  if constexpr (std::is_same_v<T, bf16>)
    return dnnl::memory::data_type::bf16;
  else
    return dnnl::memory::data_type::f32;
}

// Runs a primitive and waits for it (the next Kokkos kernel reads what it wrote).
inline void run(const dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args) {
  p.execute(ctx().stream, args);
  ctx().stream.wait();
}

// ---- products -----------------------------------------------------------------------------------
struct matmul_entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
};
inline primitive_cache<matmul_entry>& matmul_cache() {
  static primitive_cache<matmul_entry> c(cache_capacity);
  return c;
}

// C[b] = op(A[b]) op(B[b]), row-major and contiguous (kernels::product's contract).
template <class T>
void matmul(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, const T* a,
            const T* b, T* c) {
  using dims = dnnl::memory::dims;
  const auto dt = data_type_of<T>();
  const key_type key{static_cast<std::int64_t>(dt), nb, m, n, k, trans_a, trans_b};
  auto& e = matmul_cache().get(key, [&] {
    const dnnl::memory::desc a_md(dims{nb, m, k}, dt, trans_a ? dims{m * k, 1, m} : dims{m * k, k, 1});
    const dnnl::memory::desc b_md(dims{nb, k, n}, dt, trans_b ? dims{k * n, 1, k} : dims{k * n, n, 1});
    const dnnl::memory::desc c_md(dims{nb, m, n}, dt, dims{m * n, n, 1});
    return matmul_entry{dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), ctx().engine)),
                        a_md, b_md, c_md};
  });
  auto& eng = ctx().engine;
  run(e.prim, {{DNNL_ARG_SRC, dnnl::memory(e.a, eng, const_cast<T*>(a))},
               {DNNL_ARG_WEIGHTS, dnnl::memory(e.b, eng, const_cast<T*>(b))},
               {DNNL_ARG_DST, dnnl::memory(e.c, eng, c)}});
}

// The implementation oneDNN picks for a bf16 or float product of this shape (e.g.
// "brg:avx512_core_bf16"), for the benchmarks' reports.
template <class T>
std::string matmul_implementation(std::int64_t m, std::int64_t n, std::int64_t k) {
  using dims = dnnl::memory::dims;
  const auto dt = data_type_of<T>();
  const dnnl::memory::desc a_md(dims{1, m, k}, dt, dims{m * k, k, 1}), b_md(dims{1, k, n}, dt, dims{k * n, n, 1}),
      c_md(dims{1, m, n}, dt, dims{m * n, n, 1});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), ctx().engine).impl_info_str();
}

// ---- softmax along rows ----------------------------------------------------------------------------
struct softmax_entry {
  dnnl::primitive prim;
  dnnl::memory::desc md;
};
inline primitive_cache<softmax_entry>& softmax_cache() {
  static primitive_cache<softmax_entry> c(cache_capacity);
  return c;
}

// dst[r, :] = softmax(src[r, :]) (log: log_softmax) for rows x n contiguous floats; oneDNN's
// vectorised exponentials (a million a step in a small Transformer's loss).
inline void softmax(std::int64_t rows, std::int64_t n, bool log, const float* src, float* dst) {
  using dims = dnnl::memory::dims;
  const key_type key{rows, n, log};
  auto& e = softmax_cache().get(key, [&] {
    const dnnl::memory::desc md(dims{rows, n}, dnnl::memory::data_type::f32, dims{n, 1});
    auto& eng = ctx().engine;
    if (log)
      return softmax_entry{dnnl::logsoftmax_forward(dnnl::logsoftmax_forward::primitive_desc(
                               dnnl::logsoftmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1), eng)),
                           md};
    return softmax_entry{dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(
                             dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1), eng)),
                         md};
  });
  auto& eng = ctx().engine;
  run(e.prim, {{DNNL_ARG_SRC, dnnl::memory(e.md, eng, const_cast<float*>(src))}, {DNNL_ARG_DST, dnnl::memory(e.md, eng, dst)}});
}

}  // namespace meshtensor::kernels::dnnl_provider
#endif
