#pragma once
// reduce_sum over named dims, and broadcast_to (its gradient), with reduce_to, the typed entry of
// the reduction kernel (kernels/reduce.hpp) that every reduction runs. Below elementwise.hpp, whose gradients sum broadcast operands back;
// the reductions built from elementwise ops (reduce_mean, reduce_max, reduce_min, logsumexp) are
// reductions.hpp.
// Communication: reduce_sum allreduces over the axes of the reduced dims that are split (none
// when none is split); broadcast_to communicates nothing.
// NaN: reduce_to's max and min propagate NaN, locally and across processors
// (runtime/nan_allreduce.hpp), so the result does not depend on the layout or on where the NaN is.
#include <Kokkos_Core.hpp>
#include <cmath>
#include <limits>
#include <span>

#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "../runtime/nan_allreduce.hpp"
#include "../tensor/mpi_buffer.hpp"
#include "cast.hpp"
#include "../tensor/allreduce_slice.hpp"
#include "detail/op_support.hpp"
#include "detail/map_to.hpp"
#include "../kernels/reduce.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Tensor, class Dim>
struct reduced_dim_not_in_tensor {
  static_assert(sizeof(Dim) == 0, "meshtensor: a reduction names a dim that the tensor does not have");
};
template <class Target, class Source>
struct broadcast_target_lacks_dims {
  static_assert(sizeof(Target) == 0,
                "meshtensor: broadcast_to's target must hold every dim of the source tensor");
};
}  // namespace diagnostic

namespace detail {


// The axes of the dims that reducing X onto Out removes: a local sum is a partial sum over them.
template <Tensor Out, Tensor X>
constexpr unsigned removed_axes() {
  return axes_mask_of<X, difference_t<typename X::dims, typename Out::dims>>();
}

// Local reduction of x onto Out (Out's dims are a subset of X's), then allreduce over the axes of
// the removed dims that are split (with combine false, not: this processor's partial result, for
// gradient rules that hand partial sums to the tape, autodiff/tape.hpp).
template <Tensor Out, bool combine = true, Tensor X>
Out reduce_to(const X& x, reduce_op op) {
  using removed = difference_t<typename X::dims, typename Out::dims>;
  if constexpr (combine && std::is_same_v<typename X::value_type, bf16> && axes_mask_of<X, removed>() != 0) {
    // A bf16 sum's partial results, rounded before the allreduce, would be rounded twice: the
    // whole sum runs in float and is rounded once.
    if (op == reduce_op::sum)
      return cast_local<bf16>(reduce_to<typename Out::template rebind<float>, true>(cast_local<float>(x), op));
  }
  Out out(x.mesh(), result_extents<Out>(x), uninitialized);
  reduce_local<typename X::execution_space>(x.view(), x.local_extents(), positions_in_v<Out, X>, positions_in_v<X, Out>,
                                            out.view(), out.local_extents(), op);
  if constexpr (combine) {
    const collective_subject subject(&X::type_name);
    allreduce_slice(out, axes_mask_of<X, removed>(), op);
  }
  return out;
}

// A gradient rule's sum of g onto an input of type X: pushed as a partial sum for the tape to reduce.
template <Tensor X, Tensor G>
void push_summed_grad(const X& input, const G& g) {
  push_weight_grad(input, [input, g = without_node(g)] {  // a bias's gradient is a weight's
    push_partial_grad(input, reduce_to<X, false>(g, reduce_op::sum), removed_axes<X, G>());
  });
}

// Out (a superset of X's dims) with x repeated along the dims X lacks.
template <Tensor Out, Tensor X>
Out broadcast_local(const X& x, const typename Out::extents_type& extents) {
  return map_to<Out>(extents, identity_fn{}, x);
}

template <class X, class... Ds>
constexpr void check_reduced_dims() {
  (
      [] {
        if constexpr (!contains_v<Ds, typename X::dims>) (void)sizeof(diagnostic::reduced_dim_not_in_tensor<X, Ds>);
      }(),
      ...);
}

template <class X, class... Ds>
using reduced_t = with_dims_t<X, difference_t<typename X::dims, type_list<Ds...>>>;

}  // namespace detail

// x repeated along the dims of Out that x lacks: no collective (its gradient, a sum over them,
// allreduces where they are split).
template <Tensor Out, Tensor X>
constexpr comm_plan broadcast_to_plan() {
  return {};
}

// x repeated along the dims of Out that x lacks. Gradient: sum back over those dims.
template <Tensor Out, Tensor X>
Out broadcast_to(const X& x, const typename Out::extents_type& extents) {
  detail::require_same_layout<Out, X>();
  if constexpr (difference_t<typename X::dims, typename Out::dims>::size != 0)
    (void)sizeof(diagnostic::broadcast_target_lacks_dims<Out, X>);
  constexpr auto pos = detail::positions_in<X, Out>();
  for (std::size_t i = 0; i < X::rank; ++i)
    if (x.extents()[i] != extents[pos[i]])
      throw shape_error(detail::cat("broadcast_to: dim '", X::dim_names()[i], "' has extent ", x.extents()[i],
                                    " in ", X::type_name(), " but ", extents[pos[i]], " in the target ",
                                    Out::type_name()));
  const detail::op_call call(detail::planned_op{"broadcast_to", broadcast_to_plan<Out, X>()}, x);
  Out out = detail::broadcast_local<Out>(x, extents);
  detail::record<Out>(out, [x = detail::node_only(x)](const Out& g) { detail::push_summed_grad(x, g); }, x);
  return out;
}

// Plan of a reduction of X onto Out: one allreduce over the axes of the removed dims that are split.
template <Tensor Out, Tensor X>
constexpr comm_plan reduce_plan() {
  return comm_plan{}.then(collective::allreduce,
                          detail::axes_mask_of<X, difference_t<typename X::dims, typename Out::dims>>());
}

// Sum of x onto Out, whose dims are a subset of x's (in any order). Gradient: broadcast back.
template <Tensor Out, Tensor X>
Out sum_to(const X& x) {
  detail::require_same_layout<Out, X>();
  [&]<class... Ds>(type_list<Ds...>) { detail::check_reduced_dims<X, Ds...>(); }(typename Out::dims{});
  const detail::op_call call(detail::planned_op{"sum_to", reduce_plan<Out, X>()}, x);
  Out out = detail::reduce_to<Out>(x, reduce_op::sum);
  detail::record<Out>(out, [x = detail::node_only(x)](const Out& g) { detail::push_fresh_grad(x, detail::broadcast_local<X>(g, x.extents())); }, x);
  return out;
}

// Sum over the named dims.
template <Dim... Ds, Tensor X>
auto reduce_sum(const X& x) {
  detail::check_reduced_dims<X, Ds...>();
  const detail::op_call call(detail::planned_op{"reduce_sum", reduce_plan<detail::reduced_t<X, Ds...>, X>()}, x);
  return sum_to<detail::reduced_t<X, Ds...>>(x);
}

// The same tensor with its dims in another order (a local copy; no communication).
template <Dim... Ds, Tensor X>
auto transpose(const X& x) {
  using Out = detail::with_dims_t<X, type_list<Ds...>>;
  static_assert(sizeof...(Ds) == X::rank && difference_t<typename X::dims, type_list<Ds...>>::size == 0,
                "meshtensor: transpose<Dims...> must name every dim of the tensor once");
  const detail::op_call call(detail::planned_op{"transpose", broadcast_to_plan<Out, X>()}, x);
  return broadcast_to<Out>(x, detail::result_extents<Out>(x));
}

}  // namespace meshtensor
