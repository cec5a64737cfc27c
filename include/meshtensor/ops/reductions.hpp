#pragma once
// reduce_mean, reduce_max, reduce_min and logsumexp over named dims (the mean divides by the global
// number of reduced elements; logsumexp is max + log(sum(exp(x - max))), stable for large x).
// Communication: one allreduce (sum, max or min) over the axes of the reduced dims that are split;
// logsumexp allreduces max, then sum, over those axes; none when no reduced dim is split. The
// gradients communicate nothing (they broadcast locally).
// NaN propagates (docs/concepts.md, "NaN"): reduce_max, reduce_min and logsumexp are NaN where any
// element reduced is NaN, whatever the layout; reduce_max's and reduce_min's gradient then goes to
// the NaN elements (those "equal" to the result).
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "../plan/comm_plan.hpp"
#include "detail/op_support.hpp"
#include "detail/map_to.hpp"
#include "elementwise.hpp"
#include "sum_broadcast.hpp"
#include "../element/kokkos_math.hpp"
#include "../element/complex.hpp"

namespace meshtensor {

namespace detail {

// Global number of elements a reduction of X onto Out folds into one.
template <Tensor Out, Tensor X>
std::int64_t reduced_count(const X& x) {
  constexpr auto in_out = positions_in<X, Out>();
  std::int64_t n = 1;
  for (std::size_t i = 0; i != X::rank; ++i)
    if (!found_at(in_out[i], Out::rank)) n *= x.extents()[i];
  return n;
}

// Named functors for map_to (one kernel per element type, whatever the layout).
namespace opsa_fn {
template <class T>
struct divide_by {
  T n;
  KOKKOS_INLINE_FUNCTION T operator()(T v) const { return v / n; }
};
// A max finite or not: the max used to shift exponents, 0 when it is +-inf or NaN (so that a
// slice of all -inf gives -inf, not NaN).
template <class T>
KOKKOS_INLINE_FUNCTION T finite_or_zero(T v) {
  return (v - v == T(0)) ? v : T(0);
}
struct exp_shifted {  // exp(x - shift(m))
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x, T m) const {
    return kmath::exp(x - finite_or_zero(m));
  }
};
struct shift_plus_log {  // shift(m) + log(s)
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T m, T s) const {
    return finite_or_zero(m) + kmath::log(s);
  }
};
struct where_equal {  // g where x == y (or both are NaN: a NaN max came from the NaN elements), else 0
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T x, T y) const {
    return (x == y || (x != x && y != y)) ? g : T(0);
  }
};
struct times_exp_diff {  // g * exp(x - y)
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T x, T y) const {
    return g * kmath::exp(x - y);
  }
};
}  // namespace opsa_fn

// Mean of x onto Out, not recorded.
template <Tensor Out, Tensor X>
Out mean_to(const X& x) {
  using T = typename X::value_type;
  const Out s = reduce_to<Out>(x, reduce_op::sum);
  return map_to<Out>(s.extents(), opsa_fn::divide_by<T>{static_cast<T>(reduced_count<Out>(x))}, s);
}

// log(sum(exp(x))) of x onto Out, not recorded: allreduce max, then allreduce sum.
template <Tensor Out, Tensor X>
Out logsumexp_to(const X& x) {
  const Out m = reduce_to<Out>(x, reduce_op::max);
  const X e = map_to<X>(x.extents(), opsa_fn::exp_shifted{}, x, m);
  const Out s = reduce_to<Out>(e, reduce_op::sum);
  return map_to<Out>(m.extents(), opsa_fn::shift_plus_log{}, m, s);
}

// The mask of the axes of X's dims Ds that are split.
template <class X, class... Ds>
constexpr unsigned reduced_axes() {
  return axes_mask_of<X, type_list<Ds...>>();
}

}  // namespace detail

// ---- plans ------------------------------------------------------------------------------------
template <Tensor X, Dim... Ds>
constexpr comm_plan reduce_mean_plan() {
  return comm_plan{}.then(collective::allreduce, detail::reduced_axes<X, Ds...>());
}
template <Tensor X, Dim... Ds>
constexpr comm_plan reduce_max_plan() {
  return comm_plan{}.then(collective::allreduce, detail::reduced_axes<X, Ds...>());
}
template <Tensor X, Dim... Ds>
constexpr comm_plan reduce_min_plan() {
  return comm_plan{}.then(collective::allreduce, detail::reduced_axes<X, Ds...>());
}
template <Tensor X, Dim... Ds>
constexpr comm_plan logsumexp_plan() {
  constexpr unsigned axes = detail::reduced_axes<X, Ds...>();
  return comm_plan{}.then(collective::allreduce, axes).then(collective::allreduce, axes);
}

// ---- ops --------------------------------------------------------------------------------------
// Mean over the named dims. Gradient: g / count, broadcast back.
template <Dim... Ds, Tensor X>
auto reduce_mean(const X& x) {
  const detail::op_call call(detail::planned_op{"reduce_mean", reduce_mean_plan<X, Ds...>()}, x);
  detail::check_reduced_dims<X, Ds...>();
  using Out = detail::reduced_t<X, Ds...>;
  using T = typename X::value_type;
  Out out = detail::mean_to<Out>(x);
  detail::record<Out>(
      out,
      [x = detail::node_only(x)](const Out& g) {
        const T n = static_cast<T>(detail::reduced_count<Out>(x));
        detail::push_fresh_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::divide_by<T>{n}, g));
      },
      x);
  return out;
}

namespace detail {
// reduce_max / reduce_min. Gradient: g goes to every element equal to the result (all of a tie,
// as in Mesh-TensorFlow), zero elsewhere.
template <reduce_op Op, Tensor Out, Tensor X>
Out extremum(const X& x) {
  Out out = reduce_to<Out>(x, Op);
  record<Out>(
      out,
      [x, y = out.detached()](const Out& g) {
        push_fresh_grad(x, map_to<X>(x.extents(), opsa_fn::where_equal{}, g, x, y));
      },
      x);
  return out;
}
}  // namespace detail

template <Dim... Ds, Tensor X>
auto reduce_max(const X& x) {
  static_assert(!is_complex_v<typename X::value_type>, "meshtensor: reduce_max takes real values: complex ones have no order");
  const detail::op_call call(detail::planned_op{"reduce_max", reduce_max_plan<X, Ds...>()}, x);
  detail::check_reduced_dims<X, Ds...>();
  return detail::extremum<reduce_op::max, detail::reduced_t<X, Ds...>>(x);
}

template <Dim... Ds, Tensor X>
auto reduce_min(const X& x) {
  static_assert(!is_complex_v<typename X::value_type>, "meshtensor: reduce_min takes real values: complex ones have no order");
  const detail::op_call call(detail::planned_op{"reduce_min", reduce_min_plan<X, Ds...>()}, x);
  detail::check_reduced_dims<X, Ds...>();
  return detail::extremum<reduce_op::min, detail::reduced_t<X, Ds...>>(x);
}

// log(sum(exp(x))) over the named dims. Gradient: g * exp(x - result), broadcast back.
template <Dim... Ds, Tensor X>
auto logsumexp(const X& x) {
  static_assert(!is_complex_v<typename X::value_type>, "meshtensor: logsumexp takes real values, not complex ones");
  const detail::op_call call(detail::planned_op{"logsumexp", logsumexp_plan<X, Ds...>()}, x);
  detail::check_reduced_dims<X, Ds...>();
  using Out = detail::reduced_t<X, Ds...>;
  Out out = detail::logsumexp_to<Out>(x);
  detail::record<Out>(
      out,
      [x, y = out.detached()](const Out& g) {
        detail::push_fresh_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::times_exp_diff{}, g, x, y));
      },
      x);
  return out;
}

}  // namespace meshtensor
