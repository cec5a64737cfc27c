#pragma once
// Elementwise unary and binary ops, broadcasting by name. A binary op's result holds the union of
// its operands' dims: the first operand's dims in order, then the second's that the first lacks.
// Communication: none forward (elementwise_plan). The gradient of a broadcast operand sums over the
// dims it lacks, which allreduces over their axes when they are split.
#include <Kokkos_Core.hpp>
#include <cmath>

#include "../tensor/init.hpp"
#include "detail/op_support.hpp"
#include "detail/map_to.hpp"
#include "sum_broadcast.hpp"
#include "../element/complex.hpp"
#include "../element/kokkos_math.hpp"
#include "op_call.hpp"

namespace meshtensor {

// Every elementwise op (unary, binary, where, and a fused expression): no collective forward.
constexpr comm_plan elementwise_plan() { return {}; }

namespace detail {

// out(o) = f(ops(o)...) over Out's dims; each operand broadcasts along the dims it lacks. Prefer a
// named functor: with one, every layout shares one Kokkos kernel (see kernels/map.hpp).
template <Tensor Out, class F, Tensor... Ops>
Out map_broadcast(const typename Out::extents_type& extents, F f, const Ops&... ops) {
  return map_to<Out>(extents, f, ops...);
}

// Functors that adapt the op tables below to map_to. The gradient rules multiply by the
// conjugate of the partial (the conjugate Wirtinger convention of element/complex.hpp; the partial
// itself for real types).
template <class Fn>
struct apply_fn {
  template <class... T>
  KOKKOS_INLINE_FUNCTION auto operator()(T... v) const {
    return Fn::f(v...);
  }
};
template <class Fn>
struct unary_grad_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T x, T y) const {
    if constexpr (requires { Fn::grad(g, x, y); })
      return Fn::grad(g, x, y);
    else
      return g * conj_value(Fn::df(x, y));
  }
};
template <class Fn>
struct binary_grad_a_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T a, T b) const {
    return g * conj_value(Fn::da(a, b));
  }
};
template <class Fn>
struct binary_grad_b_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T a, T b) const {
    return g * conj_value(Fn::db(a, b));
  }
};
struct select_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T c, T a, T b) const {
    return c != T(0) ? a : b;
  }
};
template <bool WhenTrue>
struct select_grad_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T g, T c, T) const {
    return (c != T(0)) == WhenTrue ? g : T(0);
  }
};

template <class A, class B>
using union_result_t = with_dims_t<A, union_t<typename A::dims, typename B::dims>>;

// A rank-0 tensor holding a scalar, so that tensor-scalar ops reuse the broadcasting kernels.
template <Tensor Like>
auto scalar_like(const Like& like, typename Like::value_type v) {
  using S = with_dims_t<Like, type_list<>>;
  return full<S>(like.mesh(), {}, v);
}
}  // namespace detail

// ---- unary ----------------------------------------------------------------------------------
// Each functor gives f(x) and df(x, y) with y = f(x), the derivative used by the gradient rule.
// COMPLEX says whether it takes complex values: the holomorphic ones do; the others refuse them at
// compile time, naming the op (an order, as relu's, or no complex form here, as sigmoid's; abs of a
// complex tensor is ops/complex_parts.hpp's, a real magnitude).
namespace fn {
using kmath::cos;
using kmath::fabs;
using kmath::sin;
using kmath::sqrt;
using kmath::vectorised::exp;
using kmath::vectorised::log;
using kmath::vectorised::tanh;
#define MESHTENSOR_UNARY(NAME, COMPLEX, F, DF)                                 \
  struct NAME##_fn {                                                           \
    static constexpr const char* name = #NAME;                                 \
    template <class T>                                                         \
    KOKKOS_INLINE_FUNCTION static T f(T x) {                                   \
      static_assert(COMPLEX || !is_complex_v<T>, "meshtensor: " #NAME " takes real values, not complex ones"); \
      return F;                                                                \
    }                                                                          \
    template <class T>                                                         \
    KOKKOS_INLINE_FUNCTION static T df([[maybe_unused]] T x, [[maybe_unused]] T y) { \
      return DF;                                                               \
    }                                                                          \
  };
MESHTENSOR_UNARY(negative, true, -x, T(-1))
MESHTENSOR_UNARY(abs, false, fabs(x), (x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0))))
MESHTENSOR_UNARY(exp, true, exp(x), y)
MESHTENSOR_UNARY(log, true, log(x), T(1) / x)
MESHTENSOR_UNARY(sqrt, true, sqrt(x), T(0.5) / y)
MESHTENSOR_UNARY(rsqrt, false, T(1) / sqrt(x), T(-0.5) * y * y * y)
MESHTENSOR_UNARY(square, true, x* x, T(2) * x)
MESHTENSOR_UNARY(reciprocal, true, T(1) / x, -y * y)
MESHTENSOR_UNARY(sigmoid, false, T(1) / (T(1) + exp(-x)), y*(T(1) - y))
MESHTENSOR_UNARY(tanh, false, tanh(x), T(1) - y * y)
// relu's gradient is a select, g where x > 0 (as PyTorch's threshold_backward): g * df is a
// multiply by a branch, which g++ neither vectorises nor predicts on a relu's random signs.
struct relu_fn {
  static constexpr const char* name = "relu";
  template <class T>
  KOKKOS_INLINE_FUNCTION static T f(T x) {
    static_assert(!is_complex_v<T>, "meshtensor: relu takes real values, not complex ones");
    return x > T(0) ? x : T(0);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T df(T x, T) {
    return x > T(0) ? T(1) : T(0);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T grad(T g, T x, T) {
    return x > T(0) ? g : T(0);
  }
};
MESHTENSOR_UNARY(sin, true, sin(x), cos(x))
MESHTENSOR_UNARY(cos, true, cos(x), -sin(x))
// gelu, tanh approximation (as in BERT and Mesh-TensorFlow).
MESHTENSOR_UNARY(gelu, false, T(0.5) * x * (T(1) + tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x))),
                 (T(0.5) * (T(1) + tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x))) +
                  T(0.5) * x * (T(1) - tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x)) *
                                           tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x))) *
                      T(0.7978845608028654) * (T(1) + T(3) * T(0.044715) * x * x)))
// silu (swish), x * sigmoid(x): the gate of Llama's SwiGLU feed-forward. Its derivative,
// s (1 + x (1 - s)) with s = sigmoid(x), is s (1 + x - y) since x s = y.
MESHTENSOR_UNARY(silu, false, x / (T(1) + exp(-x)), (T(1) / (T(1) + exp(-x))) * (T(1) + x - y))
#undef MESHTENSOR_UNARY
}  // namespace fn

template <class Fn, Tensor X>
X unary(const X& x) {
  const detail::op_call call(detail::planned_op{Fn::name, elementwise_plan()}, x);
  X out = detail::map_to<X>(x.extents(), detail::apply_fn<Fn>{}, x);
  detail::record<X>(
      out,
      [x, y = out.detached()](const X& g) {
        detail::push_fresh_grad(x, detail::map_to<X>(x.extents(), detail::unary_grad_fn<Fn>{}, g, x, y));
      },
      x);
  return out;
}

#define MESHTENSOR_UNARY_API(NAME) \
  template <Tensor X>              \
  X NAME(const X& x) {             \
    return unary<fn::NAME##_fn>(x); \
  }
MESHTENSOR_UNARY_API(negative)
MESHTENSOR_UNARY_API(abs)
MESHTENSOR_UNARY_API(exp)
MESHTENSOR_UNARY_API(log)
MESHTENSOR_UNARY_API(sqrt)
MESHTENSOR_UNARY_API(rsqrt)
MESHTENSOR_UNARY_API(square)
MESHTENSOR_UNARY_API(reciprocal)
MESHTENSOR_UNARY_API(sigmoid)
MESHTENSOR_UNARY_API(tanh)
MESHTENSOR_UNARY_API(relu)
MESHTENSOR_UNARY_API(sin)
MESHTENSOR_UNARY_API(cos)
MESHTENSOR_UNARY_API(gelu)
MESHTENSOR_UNARY_API(silu)
#undef MESHTENSOR_UNARY_API

// ---- binary ---------------------------------------------------------------------------------
// Each functor gives f(a, b) and the partials da(a, b), db(a, b).
namespace fn {
using kmath::pow;
using kmath::vectorised::log;
#define MESHTENSOR_BINARY(NAME, COMPLEX, F, DA, DB)                                         \
  struct NAME##_fn {                                                                        \
    static constexpr const char* name = #NAME;                                              \
    template <class T>                                                                      \
    KOKKOS_INLINE_FUNCTION static T f(T a, T b) {                                           \
      static_assert(COMPLEX || !is_complex_v<T>, "meshtensor: " #NAME " takes real values, not complex ones"); \
      return F;                                                                             \
    }                                                                                       \
    template <class T>                                                                      \
    KOKKOS_INLINE_FUNCTION static T da([[maybe_unused]] T a, [[maybe_unused]] T b) {        \
      return DA;                                                                            \
    }                                                                                       \
    template <class T>                                                                      \
    KOKKOS_INLINE_FUNCTION static T db([[maybe_unused]] T a, [[maybe_unused]] T b) {        \
      return DB;                                                                            \
    }                                                                                       \
  };
MESHTENSOR_BINARY(add, true, a + b, T(1), T(1))
MESHTENSOR_BINARY(subtract, true, a - b, T(1), T(-1))
MESHTENSOR_BINARY(multiply, true, a* b, b, a)
MESHTENSOR_BINARY(divide, true, a / b, T(1) / b, -a / (b * b))
// Ties send the gradient to the first operand, as a subgradient must pick one. NaN propagates
// (detail::nan_min / nan_max, element/nan.hpp): NaN if either operand is, and the gradient
// goes to the NaN operand (the first if both are).
MESHTENSOR_BINARY(minimum, false, detail::nan_min(a, b), (a <= b || a != a ? T(1) : T(0)), (a <= b || a != a ? T(0) : T(1)))
MESHTENSOR_BINARY(maximum, false, detail::nan_max(a, b), (a >= b || a != a ? T(1) : T(0)), (a >= b || a != a ? T(0) : T(1)))
MESHTENSOR_BINARY(pow, false, pow(a, b), b* pow(a, b - T(1)), (a > T(0) ? pow(a, b) * log(a) : T(0)))
// Comparisons give 1 or 0 in the element type and pass no gradient.
MESHTENSOR_BINARY(equal, true, (a == b ? T(1) : T(0)), T(0), T(0))
MESHTENSOR_BINARY(not_equal, true, (a != b ? T(1) : T(0)), T(0), T(0))
MESHTENSOR_BINARY(less, false, (a < b ? T(1) : T(0)), T(0), T(0))
MESHTENSOR_BINARY(less_equal, false, (a <= b ? T(1) : T(0)), T(0), T(0))
MESHTENSOR_BINARY(greater, false, (a > b ? T(1) : T(0)), T(0), T(0))
MESHTENSOR_BINARY(greater_equal, false, (a >= b ? T(1) : T(0)), T(0), T(0))
#undef MESHTENSOR_BINARY
}  // namespace fn

namespace detail {
// The gradient of one operand of a binary op: g * partial, summed over the dims the operand lacks.
// An operand of the result's shape needs no sum (reduce_to would be a plain copy), and where the
// partial is 1 (add, and subtract's first operand) g itself is passed on (no multiply pass).
template <class Fn, bool First, Tensor Op, Tensor R, Tensor A, Tensor B>
void push_binary_grad(const Op& op, const R& g, const A& a, const B& b, const typename R::extents_type& extents) {
  constexpr bool unit = std::is_same_v<Fn, fn::add_fn> || (First && std::is_same_v<Fn, fn::subtract_fn>);
  using partial = std::conditional_t<First, binary_grad_a_fn<Fn>, binary_grad_b_fn<Fn>>;
  if constexpr (std::is_same_v<Fn, fn::subtract_fn> && !First) {  // -g: reads no operand (binary's tape keeps none)
    if constexpr (std::is_same_v<Op, R>)
      push_fresh_grad(op, map_to<R>(extents, apply_fn<fn::negative_fn>{}, g));
    else
      push_summed_grad(op, map_to<R>(extents, apply_fn<fn::negative_fn>{}, g));
  } else if constexpr (unit && std::is_same_v<Op, R>)
    push_grad(op, g);
  else if constexpr (unit)
    push_summed_grad(op, g);
  else if constexpr (std::is_same_v<Op, R>)
    push_fresh_grad(op, map_to<R>(extents, partial{}, g, a, b));
  else
    push_summed_grad(op, map_to<R>(extents, partial{}, g, a, b));
}
}  // namespace detail

template <class Fn, Tensor A, Tensor B>
auto binary(const A& a, const B& b) {
  detail::require_same_layout<A, B>();
  using R = detail::union_result_t<A, B>;
  detail::check_shared_extents(Fn::name, a, b);
  const detail::op_call call(detail::planned_op{Fn::name, elementwise_plan()}, a);
  const auto extents = detail::result_extents<R>(a, b);
  R out = detail::map_to<R>(extents, detail::apply_fn<Fn>{}, a, b);
  // A sum's rule reads neither operand's values: the tape keeps their nodes only.
  constexpr bool reads_operands = !std::is_same_v<Fn, fn::add_fn> && !std::is_same_v<Fn, fn::subtract_fn>;
  detail::record<R>(
      out,
      [a = reads_operands ? a : detail::node_only(a), b = reads_operands ? b : detail::node_only(b), extents](const R& g) {
        if (a.tracks_grad()) detail::push_binary_grad<Fn, true>(a, g, a, b, extents);
        if (b.tracks_grad()) detail::push_binary_grad<Fn, false>(b, g, a, b, extents);
      },
      a, b);
  return out;
}

#define MESHTENSOR_BINARY_API(NAME)                           \
  template <Tensor A, Tensor B>                               \
  auto NAME(const A& a, const B& b) {                         \
    return binary<fn::NAME##_fn>(a, b);                       \
  }                                                           \
  template <Tensor A>                                         \
  auto NAME(const A& a, typename A::value_type s) {           \
    return binary<fn::NAME##_fn>(a, detail::scalar_like(a, s)); \
  }                                                           \
  template <Tensor B>                                         \
  auto NAME(typename B::value_type s, const B& b) {           \
    return binary<fn::NAME##_fn>(detail::scalar_like(b, s), b); \
  }
MESHTENSOR_BINARY_API(add)
MESHTENSOR_BINARY_API(subtract)
MESHTENSOR_BINARY_API(multiply)
MESHTENSOR_BINARY_API(divide)
MESHTENSOR_BINARY_API(minimum)
MESHTENSOR_BINARY_API(maximum)
MESHTENSOR_BINARY_API(pow)
MESHTENSOR_BINARY_API(equal)
MESHTENSOR_BINARY_API(not_equal)
MESHTENSOR_BINARY_API(less)
MESHTENSOR_BINARY_API(less_equal)
MESHTENSOR_BINARY_API(greater)
MESHTENSOR_BINARY_API(greater_equal)
#undef MESHTENSOR_BINARY_API

template <Tensor A, Tensor B>
auto operator+(const A& a, const B& b) { return add(a, b); }
template <Tensor A, Tensor B>
auto operator-(const A& a, const B& b) { return subtract(a, b); }
template <Tensor A, Tensor B>
auto operator*(const A& a, const B& b) { return multiply(a, b); }
template <Tensor A, Tensor B>
auto operator/(const A& a, const B& b) { return divide(a, b); }
template <Tensor A>
auto operator-(const A& a) { return negative(a); }
template <Tensor A>
auto operator*(const A& a, typename A::value_type s) { return multiply(a, s); }
template <Tensor A>
auto operator*(typename A::value_type s, const A& a) { return multiply(s, a); }
template <Tensor A>
auto operator+(const A& a, typename A::value_type s) { return add(a, s); }
template <Tensor A>
auto operator-(const A& a, typename A::value_type s) { return subtract(a, s); }
template <Tensor A>
auto operator/(const A& a, typename A::value_type s) { return divide(a, s); }
template <Tensor A>
auto operator+(typename A::value_type s, const A& a) { return add(s, a); }
template <Tensor A>
auto operator-(typename A::value_type s, const A& a) { return subtract(s, a); }
template <Tensor A>
auto operator/(typename A::value_type s, const A& a) { return divide(s, a); }

// where(c, a, b): a where c != 0, else b, over the union of the three operands' dims.
// Gradient: to a where c holds, to b elsewhere; none to c.
template <Tensor C, Tensor A, Tensor B>
auto where(const C& c, const A& a, const B& b) {
  detail::require_same_layout<C, A>();
  detail::require_same_layout<A, B>();
  using R = detail::with_dims_t<A, union_t<union_t<typename C::dims, typename A::dims>, typename B::dims>>;
  detail::check_shared_extents("where", c, a);
  detail::check_shared_extents("where", c, b);
  detail::check_shared_extents("where", a, b);
  const detail::op_call call(detail::planned_op{"where", elementwise_plan()}, a);
  const auto extents = detail::result_extents<R>(c, a, b);
  R out = detail::map_to<R>(extents, detail::select_fn{}, c, a, b);
  detail::record<R>(
      out,
      [c, a, b, extents](const R& g) {
        if (a.tracks_grad())
          detail::push_grad(a, detail::reduce_to<A>(detail::map_to<R>(extents, detail::select_grad_fn<true>{}, g, c, a),
                                                    reduce_op::sum));
        if (b.tracks_grad())
          detail::push_grad(b, detail::reduce_to<B>(detail::map_to<R>(extents, detail::select_grad_fn<false>{}, g, c, b),
                                                    reduce_op::sum));
      },
      a, b);
  return out;
}

}  // namespace meshtensor
