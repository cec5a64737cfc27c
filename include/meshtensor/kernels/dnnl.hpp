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
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../element/bf16.hpp"
#include "../error.hpp"
#include "../runtime/cpu_isa.hpp"

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

// The provider rule, decided once from the ISA the job agreed on (runtime/cpu_isa.hpp) and so the
// same on every rank: replicas round alike. oneDNN 2.x computes bf16 only on AVX-512 cores (natively
// with AVX512_BF16 or AMX, emulated on plain AVX-512), and its brgemm matmul, faster than OpenBLAS's
// sgemm at every shape of a Transformer step there (1.07-1.24x, docs/performance.md), exists only
// there too. Below AVX-512, float products stay with OpenBLAS and bf16 products and convolutions
// take the portable paths: operands widened to float, float accumulation, one rounding.
// A fixed rule, not a per-shape race at run time. One exception, for replicas' sake: OpenBLAS picks
// its kernels per CPU (or by OPENBLAS_CORETYPE), so where the ranks' picks differ (a job over unlike
// nodes) float products go to oneDNN below AVX-512 too, capped at the agreed ISA on every rank.
inline bool avx512() { return meshtensor::cpu_isa().job >= cpu_isa_level::avx512_core; }
// bf16 products and convolutions go to oneDNN on AVX-512 (one rule: the same answer on every rank).
inline bool has_bf16() { return enabled() && avx512(); }
inline bool float_products() { return enabled() && (avx512() || !meshtensor::cpu_isa().openblas_cores_agree); }

// The ISA oneDNN dispatches to (for the reports; asked after the agreement, which it would fix).
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

// What to do about a oneDNN failure that is still an error, in meshtensor's words.
inline std::string advice() {
  return meshtensor::detail::cat("(oneDNN on ", isa_name(), ", the job's agreed ISA ", name_of(meshtensor::cpu_isa().job),
                                 "; MESHTENSOR_KERNELS=portable runs the portable kernels instead)");
}

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
// A shape's entry is made when the shape is first asked for: the primitive, or none where oneDNN
// cannot make one (then that shape takes the portable path for the rest of the run, decided once:
// the same on every replica, which shares its shapes).
struct matmul_entry {
  std::optional<dnnl::matmul> prim;
  dnnl::memory::desc a, b, c;
};
inline primitive_cache<matmul_entry>& matmul_cache() {
  static primitive_cache<matmul_entry> c(cache_capacity);
  return c;
}
// How many shapes oneDNN refused in this run (their products ran on the portable path), and the
// first refusal, for describe().
struct refusals {
  std::mutex mu;
  std::int64_t shapes = 0;
  std::string first;
};
inline refusals& matmul_refusals() {
  static refusals r;
  return r;
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, bf16> ? "bf16" : "float";
}

// C[b] = op(A[b]) op(B[b]), or C[b] += it with accumulate (a sum post-op: kernels::
// product_into_float), row-major and contiguous (kernels::product's contract); C of A's type or
// float. False, having done nothing, where oneDNN has no primitive for this shape and types: the
// caller takes its portable path.
template <class T, class TOut = T>
bool matmul(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, const T* a,
            const T* b, TOut* c, bool accumulate = false) {
  using dims = dnnl::memory::dims;
  const auto dt = data_type_of<T>(), dt_out = data_type_of<TOut>();
  const key_type key{static_cast<std::int64_t>(dt), static_cast<std::int64_t>(dt_out), accumulate, nb, m, n, k,
                     trans_a, trans_b};
  auto& e = matmul_cache().get(key, [&] {
    matmul_entry made{std::nullopt, dnnl::memory::desc(dims{nb, m, k}, dt, trans_a ? dims{m * k, 1, m} : dims{m * k, k, 1}),
                      dnnl::memory::desc(dims{nb, k, n}, dt, trans_b ? dims{k * n, 1, k} : dims{k * n, n, 1}),
                      dnnl::memory::desc(dims{nb, m, n}, dt_out, dims{m * n, n, 1})};
    try {
      dnnl::primitive_attr attr;
      if (accumulate) {
        dnnl::post_ops sum;
        sum.append_sum(1.0f);
        attr.set_post_ops(sum);
      }
      made.prim =
          dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(made.a, made.b, made.c), attr, ctx().engine));
    } catch (const dnnl::error& err) {
      auto& r = matmul_refusals();
      std::lock_guard<std::mutex> lock(r.mu);
      if (r.shapes++ == 0)
        r.first = meshtensor::detail::cat(type_name<T>(), " [", nb, " x ", m, " x ", k, "] . [", k, " x ", n, "]",
                                          std::is_same_v<T, TOut> ? "" : " into float", accumulate ? ", added" : "",
                                          ": ", err.what());
    }
    return made;
  });
  if (!e.prim) return false;
  auto& eng = ctx().engine;
  try {
    run(*e.prim, {{DNNL_ARG_SRC, dnnl::memory(e.a, eng, const_cast<T*>(a))},
                  {DNNL_ARG_WEIGHTS, dnnl::memory(e.b, eng, const_cast<T*>(b))},
                  {DNNL_ARG_DST, dnnl::memory(e.c, eng, c)}});
  } catch (const dnnl::error& err) {
    throw error(meshtensor::detail::cat("meshtensor: einsum's local product of ", type_name<T>(), " [", nb, " x ", m, " x ",
                                        k, "] . [", k, " x ", n, "] failed in oneDNN's matmul: ", err.what(), " ",
                                        advice()));
  }
  return true;
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

inline void softmax_checked(const key_type& key, std::int64_t rows, std::int64_t n, bool log, const float* src, float* dst) {
  using dims = dnnl::memory::dims;
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

// dst[r, :] = softmax(src[r, :]) (log: log_softmax) for rows x n contiguous floats; oneDNN's
// vectorised exponentials (a million a step in a small Transformer's loss).
inline void softmax(std::int64_t rows, std::int64_t n, bool log, const float* src, float* dst) {
  const key_type key{rows, n, log};
  auto words = [&] {
    return meshtensor::detail::cat("the cross-entropy's local ", log ? "log_softmax" : "softmax", " of float rows [", rows,
                                   " x ", n, "]");
  };
  try {
    softmax_checked(key, rows, n, log, src, dst);
  } catch (const dnnl::error& err) {
    throw error(meshtensor::detail::cat("meshtensor: oneDNN failed on ", words(), ": ", err.what(), " ", advice()));
  }
}

}  // namespace meshtensor::kernels::dnnl_provider
#endif
