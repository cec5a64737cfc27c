#pragma once
// cast<U>(x): the same tensor with its elements converted to U (static_cast); stop_gradient(x):
// the same values, cut off the tape.
// Communication: none, forward or gradient (a partial gradient is passed on partial, see cast_rule).
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "../element/complex.hpp"
#include "../plan/comm_plan.hpp"
#include "detail/op_support.hpp"
#include "detail/map_to.hpp"
#include "op_call.hpp"

namespace meshtensor {

template <class U, Tensor X>
constexpr comm_plan cast_plan() {
  return {};
}
template <Tensor X>
constexpr comm_plan stop_gradient_plan() {
  return {};
}

namespace detail {
namespace opsa_fn {
template <class U>
struct convert {
  template <class T>
  KOKKOS_INLINE_FUNCTION U operator()(T v) const {
    return static_cast<U>(v);
  }
};
struct real_part_of {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(Kokkos::complex<T> v) const {
    return v.real();
  }
};
}  // namespace opsa_fn
template <class U, Tensor X>
typename X::template rebind<U> cast_local(const X& x) {
  return map_to<typename X::template rebind<U>>(x.extents(), opsa_fn::convert<U>{}, x);
}
// The gradient cast back. Casting is linear, so a gradient that is still a partial sum over some
// axes goes back as one, reduced where x's gradient is (a bf16 copy of a float weight: once per
// step in float, in the weights' buckets, instead of once per use in bf16).
template <class X, class Out>
struct cast_rule {
  X x;
  void operator()(const Out& g) const { push_grad(x, cast_local<typename X::value_type>(g)); }
  bool partial(const Out& g, axis_set axes) const {
    push_partial_grad(x, cast_local<typename X::value_type>(g), axes);
    return true;
  }
};

// The float gradient that a product's result for `input` can be written into: input's own where
// it is float, that of the float tensor input was cast from where it is a bf16 copy (a float
// master weight's working copy, a gathered weight's, an activation's) whose cast has not yet run
// backward and whose own gradient the pass does not hand out; else none.
template <Tensor In>
grad_node<float, In::rank, typename In::execution_space>* float_gradient_of(const In& input) {
  using T = typename In::value_type;
  if constexpr (std::is_same_v<T, float>) {
    return input.node();
  } else if constexpr (std::is_same_v<T, bf16>) {
    using F = typename In::template rebind<float>;
    auto* copy = dynamic_cast<rule_node<In, cast_rule<F, In>>*>(input.node());
    if (!copy || !copy->rule() || !copy->rule()->x.tracks_grad()) return nullptr;
    if (const auto* read = nodes_read_after_pass(); read && read->count(copy)) return nullptr;  // gradient(loss, copy)
    return copy->rule()->x.node();
  } else {
    return nullptr;
  }
}

}  // namespace detail

// Gradient: the result's gradient cast back to x's element type, when both are floating point or
// both complex; from real to complex, the real part of the result's gradient (element/complex.hpp's
// convention). Casts to or from integers pass no gradient; complex to real does not compile
// (static_cast has no such conversion: take real(), imag() or abs()).
template <class U, Tensor X>
typename X::template rebind<U> cast(const X& x) {
  using T = typename X::value_type;
  using Out = typename X::template rebind<U>;
  if constexpr (std::is_same_v<T, U>) {
    return x;
  } else {
    const detail::op_call call(detail::planned_op{"cast", cast_plan<U, X>()}, x);
    Out out = detail::cast_local<U>(x);
    if constexpr ((is_real_v<T> && is_real_v<U>) || (is_complex_v<T> && is_complex_v<U>))
      detail::record<Out>(out, detail::cast_rule<X, Out>{detail::node_only(x)}, x);
    else if constexpr (is_real_v<T> && is_complex_v<U>)
      detail::record<Out>(
          out,
          [x = detail::node_only(x)](const Out& g) {
            detail::push_fresh_grad(x, detail::map_to<X>(x.extents(), detail::opsa_fn::real_part_of{}, g));
          },
          x);
    return out;
  }
}

// The same values (sharing x's storage), with no gradient flowing back to x.
template <Tensor X>
X stop_gradient(const X& x) {
  const detail::op_call call(detail::planned_op{"stop_gradient", stop_gradient_plan<X>()}, x);
  return x.detached();
}

}  // namespace meshtensor
