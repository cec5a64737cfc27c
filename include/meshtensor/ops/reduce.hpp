#pragma once
// reduce_sum over named dims, and broadcast_to (its gradient).
// Communication: reduce_sum allreduces over the axes of the reduced dims that are split (none
// when none is split); broadcast_to communicates nothing.
#include <Kokkos_Core.hpp>
#include <cmath>

#include "../layout/plan.hpp"
#include "../runtime/collectives.hpp"
#include "detail/kernels.hpp"
#include "detail/map_kernel.hpp"

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

// Host-accessible copy of a view's data, for MPI. A no-op alias for host memory.
template <class View>
auto host_view(const View& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
}

// Allreduce of a tensor's local slice over the given axes, staged through host memory.
template <Tensor TT>
void allreduce_local(TT& t, unsigned axes, reduce_op op) {
  if (axes == 0) return;
  auto h = host_view(t.view());
  allreduce(t.mesh().communicator(), axes, h.data(), t.local_size(), op);
  Kokkos::deep_copy(t.view(), h);
}

// The local reduction, instantiated per (space, element type) only, so that reductions under many
// layouts share one kernel (compile time).
template <class Exec, class T>
void reduce_kernel(const Kokkos::View<T*, typename Exec::memory_space>& xv,
                   const Kokkos::View<T*, typename Exec::memory_space>& ov, std::int64_t n, const kidx& out_ext,
                   int rout, const kidx& base_stride, const kidx& red_ext, const kidx& red_stride, int nred,
                   std::int64_t red_count, reduce_op op) {
  Kokkos::parallel_for(
      "meshtensor::reduce", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t o) {
        const std::int64_t base = operand_offset(o, out_ext, base_stride, rout);
        T acc = op == reduce_op::sum ? T(0) : xv(base);
        for (std::int64_t r = 0; r < red_count; ++r) {
          // One reduced dim (the common case): its offset needs no 64-bit division.
          const T v = xv(base + (nred == 1 ? r * red_stride[0] : operand_offset(r, red_ext, red_stride, nred)));
          acc = op == reduce_op::sum ? acc + v : (op == reduce_op::max ? (v > acc ? v : acc) : (v < acc ? v : acc));
        }
        ov(o) = acc;
      });
  Exec{}.fence();
}

// Local reduction of x onto Out (Out's dims are a subset of X's), then allreduce over the axes of
// the removed dims that are split.
template <Tensor Out, Tensor X>
Out reduce_to(const X& x, reduce_op op) {
  using removed = difference_t<typename X::dims, typename Out::dims>;
  Out out(x.mesh(), result_extents<Out>(x), uninitialized);
  const auto xs = row_major_strides<X::rank>(x.local_extents());
  const kidx out_ext = to_kidx<Out::rank>(out.local_extents());
  const kidx base_stride = broadcast_strides<Out>(x);
  kidx red_ext{}, red_stride{};
  int nred = 0;
  std::int64_t red_count = 1;
  constexpr auto in_out = positions_in<X, Out>();
  for (std::size_t i = 0; i < X::rank; ++i)
    if (in_out[i] >= Out::rank) {
      red_ext[nred] = x.local_extents()[i];
      red_stride[nred] = xs[i];
      red_count *= x.local_extents()[i];
      ++nred;
    }
  reduce_kernel<typename X::execution_space>(x.view(), out.view(), out.local_size(), out_ext, static_cast<int>(Out::rank),
                                             base_stride, red_ext, red_stride, nred, red_count, op);
  allreduce_local(out, axes_mask_of<X, removed>(), op);
  return out;
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
  Out out = detail::broadcast_local<Out>(x, extents);
  detail::record<Out>(out, [x](const Out& g) { detail::push_fresh_grad(x, detail::reduce_to<X>(g, reduce_op::sum)); }, x);
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
  Out out = detail::reduce_to<Out>(x, reduce_op::sum);
  detail::record<Out>(out, [x](const Out& g) { detail::push_fresh_grad(x, detail::broadcast_local<X>(g, x.extents())); }, x);
  return out;
}

// Sum over the named dims.
template <Dim... Ds, Tensor X>
auto reduce_sum(const X& x) {
  detail::check_reduced_dims<X, Ds...>();
  return sum_to<detail::reduced_t<X, Ds...>>(x);
}

// The same tensor with its dims in another order (a local copy; no communication).
template <Dim... Ds, Tensor X>
auto transpose(const X& x) {
  using Out = detail::with_dims_t<X, type_list<Ds...>>;
  static_assert(sizeof...(Ds) == X::rank && difference_t<typename X::dims, type_list<Ds...>>::size == 0,
                "meshtensor: transpose<Dims...> must name every dim of the tensor once");
  return broadcast_to<Out>(x, detail::result_extents<Out>(x));
}

}  // namespace meshtensor
