#pragma once
// einsum_scattered<S>(a, w): relayout<S>(einsum_partial<S's dims...>(a, w)), where the product
// contracts dims split over axes A and S is its result with one dim D split over exactly A, which
// a holds whole (sequence parallelism's reduce_scatter after a block's last product: Korthikanti
// et al. 2022), computed part by part around the ring of A: each processor computes its addend
// for one part's rows of the result while the sum so far of the part before travels, and each
// part's sum ends on its owner after P - 1 hops (Megatron-Core's tensor-parallel communication
// overlap in its ring-exchange form; ops/detail/ring_passes.hpp). D must be a dim of a and not of
// w. Equal to einsum_partial then relayout (the same addends, summed in ring order; in float for
// bf16, rounded once).
// Backward, one ring: the result's gradient gathered part by part, each part's product with w
// giving a's gradient's rows of that part as the next part travels (relayout's allgather,
// overlapped); w's gradient is the product of a with the gathered gradient.
// Communication: P - 1 shifts over A forward, P - 1 backward. Gradient: through a and w.
#include <optional>
#include <type_traits>

#include "detail/ring_passes.hpp"
#include "einsum.hpp"
#include "op_call.hpp"
#include "relayout.hpp"

namespace meshtensor {

namespace diagnostic {
template <class S, class R>
struct einsum_scattered_not_one_dim_scattered {
  static_assert(sizeof(S) == 0,
                "meshtensor: einsum_scattered<S>(a, w): S must be the product's result type (a's layout) with one "
                "dim that a holds whole split (in one range per processor, not zigzag), every other dim alike");
};
template <class D>
struct einsum_scattered_dim_not_in_a_alone {
  static_assert(sizeof(D) == 0,
                "meshtensor: einsum_scattered: the scattered dim D must be a dim of a and not of w, so that each "
                "part's rows of a give the result's rows of that part");
};
template <class S, class A>
struct einsum_scattered_axes_not_the_sums {
  static_assert(sizeof(S) == 0,
                "meshtensor: einsum_scattered: S must split the scattered dim over exactly the axes of the dims the "
                "product contracts (the partial sum's axes), as relayout of a partial_sum requires");
};
template <class A, class W>
struct einsum_scattered_dims_of_one_operand {
  static_assert(sizeof(A) == 0,
                "meshtensor: einsum_scattered: every dim of a and w must be in the other operand or the result; "
                "sum_to the others first");
};
}  // namespace diagnostic

namespace detail {

template <Dim D, Tensor S, Tensor A, Tensor W>
struct einsum_scattered_rule {
  using R = with_dims_t<A, typename S::dims>;  // the product's result under a's layout: D whole
  A a;
  W w;
  ring_parts ring;
  void operator()(const S& g) const {
    using Ad = typename A::dims;
    using Wd = typename W::dims;
    std::optional<A> da;
    std::optional<R> gathered;  // the result's gradient, whole along D, for w's
    if (a.tracks_grad()) da.emplace(a.mesh(), a.extents(), uninitialized);
    if (w.tracks_grad()) gathered.emplace(a.mesh(), g.extents(), uninitialized);
    std::optional<W> wc;  // w as a's gradient reads it, only where that is wanted
    if (da) wc.emplace(conjugated_for_gradient(without_node(made_again(w))));
    for_each_part_gathered<D, R>(without_node(g), ring, [&](const R& part, int p) {
      const std::int64_t at = ring.offset[static_cast<std::size_t>(p)];
      if (da) put_part_rows<D>(contract<Ad, false>(part, *wc), *da, at);
      if (gathered) put_part_rows<D>(part, *gathered, at);
    });
    if (da) push_partial_grad(a, std::move(*da), contracted_axes<Ad, R, W>());
    if (gathered)
      push_weight_grad(w, [w = w, a = without_node(made_again(a)), gd = std::move(*gathered)] {
        push_product_grad<Wd>(w, conjugated_for_gradient(a), gd, contracted_axes<Wd, A, R>());
      });
  }
};

template <Tensor S, Tensor R>
constexpr int scattered_dim_of() {
  if constexpr (relayout_compatible_v<S, R>)
    return the_one_split_dim<S::rank>(S::splits, R::splits);
  else
    return -1;
}

}  // namespace detail

template <Tensor S, Tensor A, Tensor W>
S einsum_scattered(const A& a, const W& w) {
  using SList = typename S::dims;
  using R = detail::with_dims_t<A, SList>;
  using Ad = typename A::dims;
  using Wd = typename W::dims;
  constexpr int at = detail::scattered_dim_of<S, R>();
  if constexpr (!detail::einsum_types_ok<SList, A, W>()) {
    return S{};
  } else if constexpr (at < 0) {
    (void)sizeof(diagnostic::einsum_scattered_not_one_dim_scattered<S, R>);
    return S{};
  } else if constexpr (!std::is_same_v<intersection_t<Ad, union_t<Wd, SList>>, Ad> ||
                       !std::is_same_v<intersection_t<Wd, union_t<Ad, SList>>, Wd>) {
    (void)sizeof(diagnostic::einsum_scattered_dims_of_one_operand<A, W>);
    return S{};
  } else {
    using D = typename detail::nth_dim<static_cast<std::size_t>(at), SList>::type;
    constexpr dim_split ring_split = S::splits[static_cast<std::size_t>(at)];
    if constexpr (!contains_v<D, Ad> || contains_v<D, Wd>) {
      (void)sizeof(diagnostic::einsum_scattered_dim_not_in_a_alone<D>);
      return S{};
    } else if constexpr (ring_split.mask() != detail::contracted_axes<SList, A, W>()) {
      (void)sizeof(diagnostic::einsum_scattered_axes_not_the_sums<S, A>);
      return S{};
    } else {
      detail::check_shared_extents("einsum_scattered", a, w);
      const auto& comm = a.mesh().communicator();
      const ring_parts ring = ring_parts_of(ring_split, comm.shape(), comm.coords(), a.template extent<D>());
      const detail::op_call call(
          detail::planned_op{"einsum_scattered", comm_plan{}.then(collective::shift, ring.axes, ring.parts - 1)}, a);
      S out = detail::ring_reduce_scattered<D, S>(a.mesh(), detail::result_extents<S>(a, w), ring, [&](int p) {
        return detail::contract<SList, false>(
            detail::rows_of_part<D>(a, ring.offset[static_cast<std::size_t>(p)], ring.extent[static_cast<std::size_t>(p)]), w);
      });
      detail::record<S>(out,
                        detail::einsum_scattered_rule<D, S, A, W>{detail::kept_for_backward(a), detail::kept_for_backward(w),
                                                                  ring},
                        a, w);
      return out;
    }
  }
}

}  // namespace meshtensor
