#pragma once
// softmax<Ds...>(x) = exp(x - logsumexp<Ds...>(x)) and log_softmax<Ds...>(x) = x - logsumexp<Ds...>(x),
// normalised over the named dims (usually one), which may be split.
// Communication: forward, logsumexp's allreduce max then allreduce sum over the axes of the named
// dims that are split; gradient, one allreduce sum over the same axes (none when none is split).
#include <Kokkos_Core.hpp>

#include "../layout/plan.hpp"
#include "detail/kernels.hpp"
#include "detail/map_kernel.hpp"
#include "elementwise.hpp"
#include "reduce.hpp"
#include "reductions.hpp"

namespace meshtensor {

namespace detail::opsa_fn {
struct exp_diff {  // exp(x - l)
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x, T l) const {
    return Kokkos::Experimental::exp(x - l);
  }
};
struct diff {  // x - l
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x, T l) const {
    return x - l;
  }
};
struct product {  // g * y
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T y) const {
    return g * y;
  }
};
struct softmax_grad {  // y * (g - s)
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T y, T g, T s) const {
    return y * (g - s);
  }
};
struct log_softmax_grad {  // g - exp(y) * s
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T y, T g, T s) const {
    return g - Kokkos::Experimental::exp(y) * s;
  }
};
}  // namespace detail::opsa_fn

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
  const R lse = detail::logsumexp_to<R>(x);
  X y = detail::map_to<X>(x.extents(), detail::opsa_fn::exp_diff{}, x, lse);
  detail::record<X>(
      y,
      [x, y = y.detached()](const X& g) {
        const R s = detail::reduce_to<R>(detail::map_to<X>(x.extents(), detail::opsa_fn::product{}, g, y), reduce_op::sum);
        detail::push_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::softmax_grad{}, y, g, s));
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
  const R lse = detail::logsumexp_to<R>(x);
  X y = detail::map_to<X>(x.extents(), detail::opsa_fn::diff{}, x, lse);
  detail::record<X>(
      y,
      [x, y = y.detached()](const X& g) {
        const R s = detail::reduce_to<R>(g, reduce_op::sum);
        detail::push_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::log_softmax_grad{}, y, g, s));
      },
      x);
  return y;
}

}  // namespace meshtensor
