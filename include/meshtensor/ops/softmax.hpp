#pragma once
// softmax<Ds...>(x) = exp(x - logsumexp<Ds...>(x)) and log_softmax<Ds...>(x) = x - logsumexp<Ds...>(x),
// normalised over the named dims (usually one), which may be split.
// Communication: forward, logsumexp's allreduce max then allreduce sum over the axes of the named
// dims that are split; gradient, one allreduce sum over the same axes (none when none is split).
#include <Kokkos_Core.hpp>

#include "../layout/plan.hpp"
#include "detail/kernels.hpp"
#include "elementwise.hpp"
#include "reduce.hpp"
#include "reductions.hpp"

namespace meshtensor {

template <Tensor X, Dim... Ds>
constexpr comm_plan softmax_plan() {
  return logsumexp_plan<X, Ds...>();
}
template <Tensor X, Dim... Ds>
constexpr comm_plan log_softmax_plan() {
  return logsumexp_plan<X, Ds...>();
}
// The gradient rule of either: one allreduce sum over the split axes of the named dims.
template <Tensor X, Dim... Ds>
constexpr comm_plan softmax_gradient_plan() {
  return comm_plan{}.then(collective::allreduce, detail::reduced_axes<X, Ds...>());
}

// Gradient: dx = y * (g - sum_Ds(g * y)).
template <Dim... Ds, Tensor X>
X softmax(const X& x) {
  static_assert(sizeof...(Ds) > 0, "meshtensor: softmax<Dims...> needs the dims to normalise over");
  detail::check_reduced_dims<X, Ds...>();
  using R = detail::reduced_t<X, Ds...>;
  using T = typename X::value_type;
  const R lse = detail::logsumexp_to<R>(x);
  X y = detail::map_broadcast<X>(
      x.extents(), KOKKOS_LAMBDA(T xv, T lv) { return detail::kx::exp(xv - lv); }, x, lse);
  detail::record<X>(
      y,
      [x, y = y.detached()](const X& g) {
        const R s = detail::reduce_to<R>(
            detail::map_broadcast<X>(x.extents(), KOKKOS_LAMBDA(T gv, T yv) { return gv * yv; }, g, y),
            reduce_op::sum);
        detail::push_grad(x, detail::map_broadcast<X>(
                                 x.extents(), KOKKOS_LAMBDA(T yv, T gv, T sv) { return yv * (gv - sv); }, y, g, s));
      },
      x);
  return y;
}

// Gradient: dx = g - exp(y) * sum_Ds(g).
template <Dim... Ds, Tensor X>
X log_softmax(const X& x) {
  static_assert(sizeof...(Ds) > 0, "meshtensor: log_softmax<Dims...> needs the dims to normalise over");
  detail::check_reduced_dims<X, Ds...>();
  using R = detail::reduced_t<X, Ds...>;
  using T = typename X::value_type;
  const R lse = detail::logsumexp_to<R>(x);
  X y = detail::map_broadcast<X>(x.extents(), KOKKOS_LAMBDA(T xv, T lv) { return xv - lv; }, x, lse);
  detail::record<X>(
      y,
      [x, y = y.detached()](const X& g) {
        const R s = detail::reduce_to<R>(g, reduce_op::sum);
        detail::push_grad(x, detail::map_broadcast<X>(
                                 x.extents(), KOKKOS_LAMBDA(T yv, T gv, T sv) { return gv - detail::kx::exp(yv) * sv; },
                                 y, g, s));
      },
      x);
  return y;
}

}  // namespace meshtensor
