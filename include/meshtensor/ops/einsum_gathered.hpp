#pragma once
// einsum_gathered<G, Out...>(x, w): einsum<Out...>(relayout<G>(x), w), where G is x's layout with
// one dim D whole that x splits over axes A (sequence parallelism's allgather before a block's
// first products: Korthikanti et al. 2022), computed part by part around the ring of A: at each of
// P steps the product runs on the part of x that is here while the next part travels
// (Megatron-Core's tensor-parallel communication overlap in its ring-exchange form). D must be a
// dim of the result and not of w (a part's product is the result's rows of that part), the product
// must contract no split dim (its result is then whole, not a partial sum), and the product's
// gradient for x must contract a dim split over A (tensor parallelism: w split over A), which the
// backward pass's ring sums over. Equal to relayout then einsum (the same products on the same
// rows; the backward pass sums x's gradient in ring order).
// Backward, two rings: x's gradient (the result's gradient times w, a partial sum over A) summed
// part by part around the ring while the next part's product runs (relayout's reduce_scatter,
// overlapped: ops/detail/ring_passes.hpp); w's gradient summed over the parts of x as they arrive
// again (relayout_regathered's second gather, overlapped). Between the passes the op keeps x's own
// part, not the gathered x (relayout_regathered's memory).
// Communication: P - 1 shifts over A forward; P - 1 more backward for x's gradient and P - 1 for
// w's. Gradient: through x and w.
#include <type_traits>

#include "detail/ring_passes.hpp"
#include "einsum.hpp"
#include "op_call.hpp"
#include "relayout.hpp"

namespace meshtensor {

namespace diagnostic {
template <class G, class X>
struct einsum_gathered_not_one_dim_gathered {
  static_assert(sizeof(G) == 0,
                "meshtensor: einsum_gathered<G>(x, w): G must be x's type with one dim whole that x splits (in one "
                "range per processor, not zigzag), every other dim split alike");
};
template <class D>
struct einsum_gathered_dim_not_in_result_alone {
  static_assert(sizeof(D) == 0,
                "meshtensor: einsum_gathered: the gathered dim D must be a dim of the result and not of w, so that "
                "each part of x gives the result's rows of that part");
};
template <class G, class W>
struct einsum_gathered_contracts_split_dim {
  static_assert(sizeof(G) == 0,
                "meshtensor: einsum_gathered: the product contracts a split dim, so its result would be a partial "
                "sum; use relayout then einsum (or einsum_partial)");
};
template <class X, class W>
struct einsum_gathered_gradient_not_over_ring {
  static_assert(sizeof(X) == 0,
                "meshtensor: einsum_gathered: x's gradient must be a partial sum over the axes x's gathered dim is "
                "split over (w split over them, as tensor parallelism splits it), which the backward pass sums "
                "around their ring; use relayout_regathered then einsum");
};
}  // namespace diagnostic

namespace detail {

template <class OutList, Dim D, Tensor G, Tensor X, Tensor W>
struct einsum_gathered_rule {
  using R = with_dims_t<G, OutList>;
  X x;  // x's own part (or its place and source: autodiff/saved_operand.hpp)
  W w;
  ring_parts ring;
  void operator()(const R& g) const {
    using Xd = typename X::dims;
    using Wd = typename W::dims;
    const R grad = without_node(g);
    if (x.tracks_grad()) {
      const auto wc = conjugated_for_gradient(without_node(made_again(w)));
      X dx = ring_reduce_scattered<D, X>(x.mesh(), x.extents(), ring, [&](int p) {
        return contract<Xd, false>(
            rows_of_part<D>(grad, ring.offset[static_cast<std::size_t>(p)], ring.extent[static_cast<std::size_t>(p)]), wc);
      });
      push_partial_grad(x, std::move(dx), axis_set(contracted_axes<Xd, R, W>() & ~ring.axes.mask()));
    }
    push_weight_grad(w, [w = w, x = without_node(made_again(x)), grad, ring = ring] {
      for_each_part_gathered<D, G>(x, ring, [&](const G& part, int p) {
        push_product_grad<Wd>(
            w, conjugated_for_gradient(part),
            rows_of_part<D>(grad, ring.offset[static_cast<std::size_t>(p)], ring.extent[static_cast<std::size_t>(p)]),
            contracted_axes<Wd, G, R>());
      });
    });
  }
};

template <Tensor G, Tensor X>
constexpr int gathered_dim_of() {
  if constexpr (relayout_compatible_v<G, X>)
    return the_one_split_dim<X::rank>(X::splits, G::splits);
  else
    return -1;
}

}  // namespace detail

template <Tensor G, Dim... Out, Tensor X, Tensor W>
detail::with_dims_t<G, type_list<Out...>> einsum_gathered(const X& x, const W& w) {
  using OutList = type_list<Out...>;
  using R = detail::with_dims_t<G, OutList>;
  constexpr int at = detail::gathered_dim_of<G, X>();
  if constexpr (at < 0) {
    (void)sizeof(diagnostic::einsum_gathered_not_one_dim_gathered<G, X>);
    return R{};
  } else if constexpr (!detail::einsum_types_ok<OutList, G, W>()) {
    return R{};
  } else {
    using D = typename detail::nth_dim<static_cast<std::size_t>(at), typename X::dims>::type;
    constexpr unsigned ring_axes = X::splits[static_cast<std::size_t>(at)].mask();
    if constexpr (!contains_v<D, OutList> || contains_v<D, typename W::dims>) {
      (void)sizeof(diagnostic::einsum_gathered_dim_not_in_result_alone<D>);
      return R{};
    } else if constexpr (detail::contracted_axes<OutList, G, W>() != 0) {
      (void)sizeof(diagnostic::einsum_gathered_contracts_split_dim<G, W>);
      return R{};
    } else if constexpr ((detail::contracted_axes<typename X::dims, R, W>() & ring_axes) != ring_axes) {
      (void)sizeof(diagnostic::einsum_gathered_gradient_not_over_ring<X, W>);
      return R{};
    } else {
      detail::check_shared_extents("einsum_gathered", x, w);
      const ring_parts ring = detail::ring_parts_along<D>(x);
      const detail::op_call call(
          detail::planned_op{"einsum_gathered", comm_plan{}.then(collective::shift, ring.axes, ring.parts - 1)}, x);
      R out(x.mesh(), detail::result_extents<R>(x, w), uninitialized);
      detail::for_each_part_gathered<D, G>(x, ring, [&](const G& part, int p) {
        detail::put_part_rows<D>(detail::contract<OutList, false>(part, w), out, ring.offset[static_cast<std::size_t>(p)]);
      });
      detail::record<R>(out,
                        detail::einsum_gathered_rule<OutList, D, G, X, W>{detail::kept_for_backward(x),
                                                                            detail::kept_for_backward(w), ring},
                        x, w);
      return out;
    }
  }
}

}  // namespace meshtensor
