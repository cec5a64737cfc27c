#pragma once
// top_k<D, KDim>(x, k): the k largest values of x along D, in descending order (ties: the lower
// index first), and their indices along D, over x's other dims followed by a new dim KDim of
// extent k. NaN ranks above every number, +inf included (as PyTorch's topk), NaNs among themselves
// by index, so a row's NaNs come first, lowest index first, under every layout.
// Communication: none when D is not split. When it is, each processor selects its local top
// candidates in min(k, longest part of D) slots (the same count on every processor; a shorter part
// leaves slots marked empty), one allgather over D's axes exchanges them (values and global
// indices packed as doubles), and every processor selects the top k from them. KDim may be split:
// each processor keeps its part. Gradient: to the selected positions (an allgather of the
// gradient over KDim's axes when KDim is split; none otherwise).
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

template <class Values, class Indices>
struct top_k_result {
  Values values;
  Indices indices;  // std::int64_t positions along the reduced dim
};

namespace detail {

template <class X, class D, class KDim>
using top_k_values_t = with_dims_t<X, union_t<difference_t<typename X::dims, type_list<D>>, type_list<KDim>>>;
template <class X, class D, class KDim>
using top_k_indices_t = typename top_k_values_t<X, D, KDim>::template rebind<std::int64_t>;

// The order of top_k: value descending with NaN above everything, then index ascending. A total
// order on (value, index), so the local selections and the merge agree whatever the split. (A bare
// v1 > v2 is false both ways for a NaN, which let a NaN sit anywhere in the buffer.)
KOKKOS_INLINE_FUNCTION bool ranks_before(double v1, std::int64_t i1, double v2, std::int64_t i2) {
  const bool nan1 = v1 != v1, nan2 = v2 != v2;
  if (nan1 || nan2) return nan1 && (!nan2 || i1 < i2);
  return v1 > v2 || (v1 == v2 && i1 < i2);
}

// Inserts (v, gi) into a descending buffer of capacity k holding `filled` entries.
template <class VV, class IV>
KOKKOS_INLINE_FUNCTION void insert_candidate(const VV& bv, const IV& bi, std::int64_t base, std::int64_t k,
                                             std::int64_t& filled, double v, std::int64_t gi) {
  std::int64_t pos;
  if (filled < k)
    pos = filled++;
  else if (k > 0 && ranks_before(v, gi, bv(base + k - 1), bi(base + k - 1)))
    pos = k - 1;
  else
    return;
  while (pos > 0 && ranks_before(v, gi, bv(base + pos - 1), bi(base + pos - 1))) {
    bv(base + pos) = bv(base + pos - 1);
    bi(base + pos) = bi(base + pos - 1);
    --pos;
  }
  bv(base + pos) = v;
  bi(base + pos) = gi;
}

// Gradient kernel: g (over the other dims and KDim) added at the selected positions of a zero x.
template <class D, class KDim, Tensor X, Tensor G>
X top_k_grad(const X& x, const Kokkos::View<std::int64_t*, typename X::memory_space>& sel, std::int64_t k,
             const G& g) {
  X gx(x.mesh(), x.extents());
  auto dst = local_along<D>(x);
  dst.v = gx.view();
  const auto gf = full_along<KDim>(g);
  const std::int64_t rows = dst.outer * dst.inner;
  kernels::parallel_for(
      "meshtensor::top_k_grad", kernels::range<typename X::execution_space>(0, rows * k),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / k, j = idx % k;
        const std::int64_t l = sel(idx) - dst.begin;
        if (l >= 0 && l < dst.n) dst.v(dst.at(r / dst.inner, l, r % dst.inner)) += gf.v(gf.at(r, j, 0));
      });
  return gx;
}

}  // namespace detail

// One allgather over D's axes (none when D is not split).
template <Tensor X, Dim D, Dim KDim>
constexpr comm_plan top_k_plan() {
  return comm_plan{}.then(collective::allgather, X::layout_type::template split_of<D>().mask());
}

template <Dim D, Dim KDim, Tensor X>
top_k_result<detail::top_k_values_t<X, D, KDim>, detail::top_k_indices_t<X, D, KDim>> top_k(const X& x,
                                                                                             std::int64_t k) {
  const detail::op_call call(detail::planned_op{"top_k", top_k_plan<X, D, KDim>()}, x);
  const detail::collective_subject subject(&X::type_name);
  using V = detail::top_k_values_t<X, D, KDim>;
  using I = detail::top_k_indices_t<X, D, KDim>;
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  using Mem = typename X::memory_space;
  static_assert(is_real_v<T>, "meshtensor: top_k needs real floating-point values (complex ones have no order)");
  static_assert(!contains_v<KDim, typename X::dims>, "meshtensor: top_k's new dim KDim is already a dim of x");
  constexpr auto s = X::layout_type::template split_of<D>();
  const std::int64_t n_global = x.template extent<D>();
  if (k < 0 || k > n_global)
    throw shape_error(detail::cat("top_k: k = ", k, " is not within [0, ", n_global, "], the extent of dim '",
                                  D::name(), "' in ", X::type_name(), x.shape_string()));
  detail::check_parts<KDim, V>("top_k", x.mesh(), k);

  const auto src = detail::local_along<D>(x);
  const std::int64_t rows = src.outer * src.inner, inner = src.inner, n = src.n, begin = src.begin;
  // Local candidates, best first: c slots per row on every processor (the exchange below needs one
  // count everywhere, and uneven parts hold different n), so slots past the local n stay unfilled,
  // marked by index -1.
  const std::int64_t longest = x.placement().max_part_extent(X::template index_of<D>());
  const std::int64_t c = k < longest ? k : longest;
  // From the caching allocator; values zeroed as Kokkos's constructor did (the kernel sets every index).
  const Kokkos::View<double*, Mem> cv = detail::view_pool<double, Mem>::get().allocate(static_cast<std::size_t>(rows * c));
  const Kokkos::View<std::int64_t*, Mem> ci = detail::view_pool<std::int64_t, Mem>::get().allocate(static_cast<std::size_t>(rows * c));
  kernels::deep_copy(cv, 0.0);
  kernels::parallel_for(
      "meshtensor::top_k_local", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t r) {
        std::int64_t filled = 0;
        for (std::int64_t l = 0; l < n; ++l)
          detail::insert_candidate(cv, ci, r * c, c, filled, static_cast<double>(src.v(src.at(r / inner, l, r % inner))),
                                   begin + l);
        for (std::int64_t j = filled; j < c; ++j) ci(r * c + j) = -1;
      });
  Kokkos::View<double*, Mem> fv = cv;
  Kokkos::View<std::int64_t*, Mem> fi = ci;
  if constexpr (s.count > 0) {
    // Exchange the candidates as (value, index) pairs of doubles, then select from all of them.
    auto& comm = x.mesh().communicator();
    const std::int64_t P = comm.size_over(s.mask());
    const Kokkos::View<double*, Mem> packed = detail::view_pool<double, Mem>::get().allocate(static_cast<std::size_t>(rows * c * 2));
    kernels::parallel_for(
        "meshtensor::top_k_pack", kernels::range<Exec>(0, rows * c), KOKKOS_LAMBDA(std::int64_t q) {
          packed(2 * q) = cv(q);
          packed(2 * q + 1) = static_cast<double>(ci(q));
        });
    using buffer = detail::mpi_buffer<Exec, double>;
    const auto send = buffer::reading(packed);
    const auto received = buffer::writing(static_cast<std::size_t>(P * rows * c * 2));
    allgather(comm, s.mask(), send.data(), rows * c * 2, received.data());
    const auto all = received.view();
    fv = detail::view_pool<double, Mem>::get().allocate(static_cast<std::size_t>(rows * k));
    fi = detail::view_pool<std::int64_t, Mem>::get().allocate(static_cast<std::size_t>(rows * k));
    kernels::deep_copy(fv, 0.0);  // zeros where Kokkos's constructor put them: slots past the candidates
    kernels::deep_copy(fi, std::int64_t{0});
    auto fv_ = fv;
    auto fi_ = fi;
    kernels::parallel_for(
        "meshtensor::top_k_merge", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t r) {
          std::int64_t filled = 0;
          for (std::int64_t p = 0; p < P; ++p)
            for (std::int64_t j = 0; j < c; ++j) {
              const std::int64_t q = (p * rows + r) * c + j;
              if (all(2 * q + 1) < 0) break;  // an unfilled slot: this part held fewer than c
              detail::insert_candidate(fv_, fi_, r * k, k, filled, all(2 * q), static_cast<std::int64_t>(all(2 * q + 1)));
            }
        });
  }

  // Keep this processor's part of KDim.
  typename V::extents_type ext{};
  for (std::size_t i = 0, j = 0; i < X::rank; ++i)
    if (i != X::template index_of<D>()) ext[j++] = x.extents()[i];
  ext[V::rank - 1] = k;
  top_k_result<V, I> out{V(x.mesh(), ext), I(x.mesh(), ext)};
  const std::int64_t kl = out.values.local_extents()[V::rank - 1], kb = out.values.template offset<KDim>();
  auto ov = out.values.view();
  auto oi = out.indices.view();
  kernels::parallel_for(
      "meshtensor::top_k_out", kernels::range<Exec>(0, rows * kl), KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t q = (idx / kl) * k + kb + idx % kl;
        ov(idx) = static_cast<T>(fv(q));
        oi(idx) = fi(q);
      });
  detail::record<V>(
      out.values, [x = detail::node_only(x), fi, k](const V& g) { detail::push_grad(x, detail::top_k_grad<D, KDim>(x, fi, k, g)); }, x);
  return out;
}

}  // namespace meshtensor
