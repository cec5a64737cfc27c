#pragma once
// partial_sum<X, Axes>: a tensor of type X that is the sum, over the processors along the mesh axes
// of the axis_set Axes, of each processor's addend. Mesh-TensorFlow's LazyAllreduceSum as a type:
// einsum_partial returns one where einsum would end with an allreduce, and the allreduce happens
// where the program says, once for everything added up before it.
//
//   linear ops keep it partial, locally: p + q and p - q (the same axes), -p, p * s, s * p, p / s;
//   p + x with x a tensor (a bias, a residual): x is added on the processors at coordinate 0 of
//     Axes only, so that the sum holds it once (added everywhere it would be held P times);
//   sum_partials(p): one allreduce over Axes, a tensor again;
//   relayout<Out>(p), where Out splits dims over exactly Axes and changes nothing else: one
//     reduce_scatter over Axes (each processor receives the sum of its new part only, half an
//     allreduce's traffic);
//   gather / gather_all: sum_partials first.
// Every other op (a nonlinear one, a product, a reduction) does not take a partial_sum: its call
// does not compile, and the program says where the allreduce goes. Forcing it implicitly would
// hide a collective in an expression (the cost the type is there to show).
// Communication: einsum_partial: einsum's, without its last allreduce (einsum_partial_plan);
// sum_partials: an allreduce over Axes; relayout: a reduce_scatter over Axes; linear ops: none.
#include <type_traits>
#include <vector>

#include "../tensor/host_io.hpp"
#include "einsum.hpp"
#include "relayout.hpp"

namespace meshtensor {

template <Tensor X, axis_set Axes>
class partial_sum {
 public:
  using tensor_type = X;
  static constexpr axis_set axes = Axes;
  partial_sum() = default;
  explicit partial_sum(X addend) : addend_(std::move(addend)) {}
  // This processor's addend: the tensor is the sum of the addends along Axes.
  const X& addend() const { return addend_; }
  const typename X::mesh_type& mesh() const { return addend_.mesh(); }
  const typename X::extents_type& extents() const { return addend_.extents(); }

 private:
  X addend_;
};

template <class T>
inline constexpr bool is_partial_sum_v = false;
template <class X, axis_set Axes>
inline constexpr bool is_partial_sum_v<partial_sum<X, Axes>> = true;

namespace diagnostic {
template <class P, class Q>
struct partial_sums_over_different_axes {
  static_assert(sizeof(P) == 0,
                "meshtensor: partial sums over different mesh axes cannot be added locally; sum_partials one "
                "of them first");
};
template <class Out, class X>
struct relayout_of_partial_sum_not_a_scatter {
  static_assert(sizeof(Out) == 0,
                "meshtensor: relayout of a partial sum: the target layout must split dims over exactly the "
                "partial sum's axes (after the axes they are already split over) and change nothing else, "
                "which makes the pending allreduce a reduce_scatter; otherwise sum_partials first");
};
}  // namespace diagnostic

namespace detail {

// Whether every axis of mask is at coordinate 0 here: of the processors along mask, exactly one.
inline bool at_origin_of(const communicator& c, axis_set mask) {
  for (std::size_t i = 0; i < c.coords().size(); ++i)
    if (mask.contains(static_cast<int>(i)) && c.coords()[i] != 0) return false;
  return true;
}

}  // namespace detail

// ---- making one -------------------------------------------------------------------------------

// einsum<Out...>(a, b), its last allreduce (over the axes of the contracted dims that are split)
// left pending: a partial_sum over those axes. Dims only one operand has are summed first, as
// einsum does. Gradient: einsum's (the gradient of a sum reaches every addend whole).
template <Dim... Out, Tensor A, Tensor B>
auto einsum_partial(const A& a, const B& b) {
  using OutList = type_list<Out...>;
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  using Ak = intersection_t<Ad, union_t<Bd, OutList>>;
  using Bk = intersection_t<Bd, union_t<Ad, OutList>>;
  using R = detail::with_dims_t<A, OutList>;
  using P = partial_sum<R, detail::contracted_axes<OutList, detail::with_dims_t<A, Ak>, detail::with_dims_t<B, Bk>>()>;
  if constexpr (!detail::einsum_types_ok<OutList, A, B>()) {
    return P{};
  } else {
    detail::check_shared_extents("einsum_partial", a, b);
    const detail::op_call call(detail::planned_op{"einsum_partial", einsum_partial_plan<OutList, A, B>()}, a);

    if constexpr (!std::is_same_v<Ak, Ad>) {
      return einsum_partial<Out...>(sum_to<detail::with_dims_t<A, Ak>>(a), b);
    } else if constexpr (!std::is_same_v<Bk, Bd>) {
      return einsum_partial<Out...>(a, sum_to<detail::with_dims_t<B, Bk>>(b));
    } else {
      return P(detail::contract_recorded<OutList, false>(a, b));
    }
  }
}

// ---- ending one -------------------------------------------------------------------------------

template <Tensor X, axis_set Axes>
constexpr comm_plan sum_partials_plan() {
  return comm_plan{}.then(collective::allreduce, Axes);
}

// The sum: one allreduce over Axes. Gradient: the sum's gradient, to the addend, whole.
template <Tensor X, axis_set Axes>
X sum_partials(const partial_sum<X, Axes>& p) {
  const detail::op_call call(detail::planned_op{"sum_partials", sum_partials_plan<X, Axes>()}, p.addend());
  const X& a = p.addend();
  X out = detail::clone(a);
  detail::allreduce_slice(out, Axes, reduce_op::sum);
  detail::record<X>(out, [a = detail::node_only(a)](const X& g) { detail::push_grad(a, g); }, a);
  return out;
}

template <Tensor Out, Tensor X, axis_set Axes>
constexpr comm_plan relayout_plan_of_partial() {
  return comm_plan{}.then(collective::reduce_scatter, Axes);
}

// The sum placed as Out, each processor receiving only its part: one reduce_scatter over Axes.
// Gradient: the result's gradient gathered back to X's layout (an allgather over Axes), to the
// addend.
template <Tensor Out, Tensor X, axis_set Axes>
Out relayout(const partial_sum<X, Axes>& p) {
  constexpr bool scatters = [] {
    if constexpr (detail::relayout_compatible_v<Out, X>)
      return scatters_over<X::rank>(X::splits, Out::splits, Axes);
    else
      return false;
  }();
  if constexpr (!scatters) {
    (void)sizeof(diagnostic::relayout_of_partial_sum_not_a_scatter<Out, X>);
    return Out{};
  } else {
    const detail::op_call call(detail::planned_op{"relayout (reduce_scatter)", relayout_plan_of_partial<Out, X, Axes>()}, p.addend());
    const X& a = p.addend();
    Out out = Axes.empty() ? detail::relayout_kernel<Out>(a, "relayout") : detail::reduce_scatter_kernel<Out>(a, Axes);
    detail::record<Out>(
        out, [a = detail::node_only(a)](const Out& g) { detail::push_grad(a, detail::relayout_kernel<X>(g, "relayout (gradient)")); }, a);
    return out;
  }
}

// On the host: the sum first.
template <Tensor X, axis_set Axes>
std::vector<typename X::value_type> gather_all(const partial_sum<X, Axes>& p) {
  return gather_all(sum_partials(p));
}
template <Tensor X, axis_set Axes>
std::vector<typename X::value_type> gather(const partial_sum<X, Axes>& p, int root = 0) {
  return gather(sum_partials(p), root);
}

// ---- linear ops: partial in, partial out, no communication --------------------------------------

namespace detail {
template <class X, axis_set A, axis_set B>
constexpr bool same_partial_axes() {
  if constexpr (A != B) (void)sizeof(diagnostic::partial_sums_over_different_axes<partial_sum<X, A>, partial_sum<X, B>>);
  return A == B;
}
}  // namespace detail

template <Tensor X, axis_set A, axis_set B>
partial_sum<X, A> operator+(const partial_sum<X, A>& p, const partial_sum<X, B>& q) {
  if constexpr (!detail::same_partial_axes<X, A, B>()) return {};
  else return partial_sum<X, A>(p.addend() + q.addend());
}
template <Tensor X, axis_set A, axis_set B>
partial_sum<X, A> operator-(const partial_sum<X, A>& p, const partial_sum<X, B>& q) {
  if constexpr (!detail::same_partial_axes<X, A, B>()) return {};
  else return partial_sum<X, A>(p.addend() - q.addend());
}
template <Tensor X, axis_set A>
partial_sum<X, A> operator-(const partial_sum<X, A>& p) {
  return partial_sum<X, A>(-p.addend());
}
template <Tensor X, axis_set A>
partial_sum<X, A> operator*(const partial_sum<X, A>& p, typename X::value_type s) {
  return partial_sum<X, A>(p.addend() * s);
}
template <Tensor X, axis_set A>
partial_sum<X, A> operator*(typename X::value_type s, const partial_sum<X, A>& p) {
  return partial_sum<X, A>(p.addend() * s);
}
template <Tensor X, axis_set A>
partial_sum<X, A> operator/(const partial_sum<X, A>& p, typename X::value_type s) {
  return partial_sum<X, A>(p.addend() / s);
}

// p + x: x joins the addend of the processor at coordinate 0 of A only (added to every addend, the
// sum would hold it once per processor). Gradient: the sum's gradient to both, whole, on every
// processor (the sum depends on x once, wherever it was added).
template <Tensor X, axis_set A>
partial_sum<X, A> operator+(const partial_sum<X, A>& p, const X& x) {
  const detail::op_call call(detail::planned_op{"partial_sum + tensor", comm_plan{}}, x);
  const X& a = p.addend();
  X out;
  {
    const no_grad local_only;
    out = detail::at_origin_of(a.mesh().communicator(), A) ? X(a + x) : detail::clone(a);
  }
  detail::record<X>(
      out,
      [a, x](const X& g) {
        detail::push_grad(a, g);
        detail::push_grad(x, g);
      },
      a, x);
  return partial_sum<X, A>(out);
}
template <Tensor X, axis_set A>
partial_sum<X, A> operator+(const X& x, const partial_sum<X, A>& p) {
  return p + x;
}

}  // namespace meshtensor
