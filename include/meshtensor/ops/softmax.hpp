#pragma once
// softmax<Ds...>(x) = exp(x - logsumexp<Ds...>(x)) and log_softmax<Ds...>(x) = x - logsumexp<Ds...>(x),
// normalised over the named dims (usually one), which may be split; causal_softmax<Q, D>(x, scale),
// attention's weights: softmax along D of scale * x with the positions after the row's own masked.
// Communication: forward, logsumexp's allreduce max then allreduce sum over the axes of the named
// dims that are split; gradient, one allreduce sum over the same axes (none when none is split).
// NaN: a row (the elements normalised together) holding a NaN is NaN throughout, under every
// layout; the max is NaN-propagating (runtime/nan_allreduce.hpp) and the sum of exponentials takes it.
#include <Kokkos_Core.hpp>

#include "../plan/comm_plan.hpp"
#include "detail/op_support.hpp"
#include "detail/map_to.hpp"
#include "../kernels/rows.hpp"
#include "elementwise.hpp"
#include "sum_broadcast.hpp"
#include "reductions.hpp"
#include "../element/kokkos_math.hpp"
#include "../element/complex.hpp"

namespace meshtensor {

namespace detail::opsa_fn {
struct exp_diff {  // exp(x - l)
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x, T l) const {
    return kmath::exp(x - l);
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
    return g - kmath::exp(y) * s;
  }
};
}  // namespace detail::opsa_fn

namespace detail {
// softmax (Log = false) or log_softmax along one dim D by the row kernels of rows.hpp; where D is
// split, the phases run with logsumexp's allreduces (max, then sum) between them, and the
// gradient with its one allreduce (sum), as the composed op did.
// scale and causal: of scale * x, under a causal window (causal_softmax).
template <bool Log, Dim D, Tensor X>
X softmax_along(const X& x, compute_t<typename X::value_type> scale = 1, causal_rows causal = {}) {
  using R = reduced_t<X, D>;
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  using F = softmax_rows<T, typename X::memory_space>;
  constexpr unsigned axes = reduced_axes<X, D>();
  const row_shape sh = rows_along<D>(x);
  R m(x.mesh(), result_extents<R>(x), uninitialized), s(x.mesh(), result_extents<R>(x), uninitialized);
  X y(x.mesh(), x.extents(), uninitialized);
  run_row_phases<Exec>(sh.rows(), F{x.view(), y.view(), m.view(), s.view(), sh, phase_all, Log, scale, causal}, axes != 0,
                       {phase_max, phase_sum, phase_write}, [&](row_phase done) {
                         if (done == phase_max) allreduce_slice(m, axes, reduce_op::max);
                         else allreduce_slice(s, axes, reduce_op::sum);
                       });
  record<X>(
      y,
      [x = node_only(x), y = y.detached(), scale, causal](const X& g) {
        using G = softmax_grad_rows<T, typename X::memory_space>;
        const row_shape gs = rows_along<D>(y);
        R s(y.mesh(), result_extents<R>(y), uninitialized);
        X dx(y.mesh(), y.extents(), uninitialized);
        run_row_phases<Exec>(gs.rows(), G{y.view(), g.view(), dx.view(), s.view(), gs, phase_all, Log, scale, causal},
                             axes != 0, {phase_sum, phase_write},
                             [&](row_phase) { allreduce_slice(s, axes, reduce_op::sum); });
        push_fresh_grad(x, std::move(dx));
      },
      x);
  return y;
}
}  // namespace detail

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
  static_assert(!is_complex_v<typename X::value_type>, "meshtensor: softmax takes real values: complex ones have no order");
  const detail::op_call call(detail::planned_op{"softmax", softmax_plan<X, Ds...>()}, x);
  static_assert(sizeof...(Ds) > 0, "meshtensor: softmax<Dims...> needs the dims to normalise over");
  detail::check_reduced_dims<X, Ds...>();
  if constexpr (sizeof...(Ds) == 1) {
    return detail::softmax_along<false, Ds...>(x);
  } else {
    using R = detail::reduced_t<X, Ds...>;
    const R lse = detail::logsumexp_to<R>(x);
    X y = detail::map_to<X>(x.extents(), detail::opsa_fn::exp_diff{}, x, lse);
    detail::record<X>(
        y,
        [x = detail::node_only(x), y = y.detached()](const X& g) {
          const R s = detail::reduce_to<R>(detail::map_to<X>(x.extents(), detail::opsa_fn::product{}, g, y), reduce_op::sum);
          detail::push_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::softmax_grad{}, y, g, s));
        },
        x);
    return y;
  }
}

// causal_softmax<Q, D>(x, scale): softmax along D of scale * x where the elements of D at global
// positions after the row's position along Q are masked out (weight 0): causal attention's
// weights, softmax<D>(scale * x + mask) with mask -inf above the diagonal, in one pass with no mask
// tensor and no exponential of the masked half. Q and D may be split (the same allreduces as
// softmax's); every row must see position 0 of D, which a causal mask of equal extents gives.
// Gradient: dx = scale * y * (g - sum_D(g * y)), 0 where masked.
template <Dim Q, Dim D, Tensor X>
X causal_softmax(const X& x, double scale = 1.0) {
  static_assert(!is_complex_v<typename X::value_type>, "meshtensor: causal_softmax takes real values: complex ones have no order");
  const detail::op_call call(detail::planned_op{"causal_softmax", softmax_plan<X, D>()}, x);
  static_assert(!std::is_same_v<Q, D>, "meshtensor: causal_softmax<Q, D> needs two different dims");
  static_assert(contains_v<Q, typename X::dims>, "meshtensor: causal_softmax<Q, D>: x has no dim Q");
  detail::check_reduced_dims<X, D>();
  using C = compute_t<typename X::value_type>;
  return detail::softmax_along<false, D>(x, static_cast<C>(scale), detail::causal_along<Q>(x));
}
template <Tensor X, Dim Q, Dim D>
constexpr comm_plan causal_softmax_plan() {
  return softmax_plan<X, D>();
}

// Gradient: dx = g - exp(y) * sum_Ds(g).
template <Dim... Ds, Tensor X>
X log_softmax(const X& x) {
  static_assert(!is_complex_v<typename X::value_type>, "meshtensor: log_softmax takes real values: complex ones have no order");
  const detail::op_call call(detail::planned_op{"log_softmax", log_softmax_plan<X, Ds...>()}, x);
  static_assert(sizeof...(Ds) > 0, "meshtensor: log_softmax<Dims...> needs the dims to normalise over");
  detail::check_reduced_dims<X, Ds...>();
  if constexpr (sizeof...(Ds) == 1) {
    return detail::softmax_along<true, Ds...>(x);
  } else {
    using R = detail::reduced_t<X, Ds...>;
    const R lse = detail::logsumexp_to<R>(x);
    X y = detail::map_to<X>(x.extents(), detail::opsa_fn::diff{}, x, lse);
    detail::record<X>(
        y,
        [x = detail::node_only(x), y = y.detached()](const X& g) {
          const R s = detail::reduce_to<R>(g, reduce_op::sum);
          detail::push_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::log_softmax_grad{}, y, g, s));
        },
        x);
    return y;
  }
}

}  // namespace meshtensor
