#pragma once
// Fully sharded parameters (ZeRO stage 3, PyTorch FSDP) as layouts: a parameter is stored split
// over the data axes (its layout splits a dim of it, d_model say, over the axes that split the
// batch), and gather_for_use<Use>(p) brings it to the layout the op computing with it needs, just
// before the use:
//
//   using stored = mt::tensor<float, shard_layout, d_model, d_ff>;     // d_model over rows, cols
//   using used   = mt::with_layout_t<stored, data_layout>;              // whole on every processor
//   auto y = mt::einsum<batch, length, d_ff>(x, mt::gather_for_use<used>(w));
//
// Communication: one allgather over the axes Use stops splitting dims over (relayout's step, read
// from the same value: relayout_plan<Use, P>). Gradient: the weight gradient of a data-parallel
// product arrives as a sum of partials over the batch's axes (autodiff/tape.hpp); when those are
// exactly the axes gathered, one reduce_scatter sums it and hands each processor its part (ZeRO's
// gradient partitioning, half an allreduce's traffic); otherwise the gradient is reduced first and
// sliced locally (relayout's rule). The optimizer then steps on each processor's part, its state
// laid out like the part (optim/optimizer.hpp): the parameters, gradients and optimizer state are
// all split, and the stored tensors never exist whole outside a use.
//
// The gathered tensor lives as long as something holds it: the op's gradient rule holds its
// operands until the backward pass, so a forward pass over every block holds every gathered
// weight, as ZeRO stage 2 would. Run the block under mt::recompute and only its input is held:
// its gathers run again in the backward pass (FSDP's reshard_after_forward).
#include <type_traits>

#include "relayout.hpp"

namespace meshtensor {

// The tensor type TT under layout L2 (same element type, space, mesh and dims).
template <class TT, Layout L2>
struct with_layout;
template <class T, Layout L, class E, Dim... Ds, Layout L2>
struct with_layout<basic_tensor<T, L, E, Ds...>, L2> {
  using type = basic_tensor<T, L2, E, Ds...>;
};
template <class TT, Layout L2>
using with_layout_t = typename with_layout<std::remove_cvref_t<TT>, L2>::type;

namespace diagnostic {
template <class Use, class Stored>
struct gather_for_use_must_only_gather {
  static_assert(sizeof(Use) == 0,
                "meshtensor: gather_for_use<Use>(p): Use must keep p's dims, element type, space and mesh, and "
                "split each dim over a prefix of the axes p's layout splits it over (it only gathers); to move a "
                "split between dims use relayout");
};
}  // namespace diagnostic

namespace detail {
// Whether `use` splits every dim over a prefix of its axes under `stored` (nothing but gathers).
template <std::size_t R>
constexpr bool only_gathers(const std::array<dim_split, R>& stored, const std::array<dim_split, R>& use) {
  for (std::size_t d = 0; d < R; ++d)
    if (common_prefix(stored[d], use[d]) != use[d].count) return false;
  return true;
}
template <class Use, class P>
constexpr bool gather_for_use_ok() {
  if constexpr (relayout_compatible_v<Use, P>) return only_gathers<P::rank>(P::splits, Use::splits);
  else return false;
}
}  // namespace detail

template <Tensor Use, Tensor P>
constexpr comm_plan gather_for_use_plan() {
  return relayout_plan<Use, P>();
}

template <Tensor Use, Tensor P>
Use gather_for_use(const P& p) {
  meshtensor::detail::plan_op_scope plan_scope("gather_for_use");
  if constexpr (!detail::gather_for_use_ok<Use, P>()) {
    (void)sizeof(diagnostic::gather_for_use_must_only_gather<Use, P>);
    return Use{};
  } else {
    Use out = detail::relayout_kernel<Use>(p, "gather_for_use");
    detail::record<Use>(out, detail::relayout_rule<Use, P>{p}, p);
    return out;
  }
}

}  // namespace meshtensor
