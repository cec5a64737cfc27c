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
#include <array>
#include <memory>
#include <optional>
#include <tuple>
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

// The backward pass of N products of x's parts, each with its weight: what the results' rules
// leave (their gradients) and what it reads (x's own part, the weights, the ring).
template <class OutList, Dim D, Tensor G, Tensor X, Tensor W, std::size_t N>
struct gathered_products {
  using R = with_dims_t<G, OutList>;
  X x;  // x's own part (or its place and source: autodiff/saved_operand.hpp)
  std::array<W, N> w;
  ring_parts ring;
  std::array<std::optional<R>, N> grads;  // each result's, where it had one

  // The rows of part p of a result's gradient g.
  static R rows(const R& g, const ring_parts& ring, int p) {
    return rows_of_part<D>(g, ring.offset[static_cast<std::size_t>(p)], ring.extent[static_cast<std::size_t>(p)]);
  }
  void backward() const {
    using Xd = typename X::dims;
    using Wd = typename W::dims;
    if (x.tracks_grad()) {
      std::array<std::optional<W>, N> wc;
      for (std::size_t i = 0; i < N; ++i)
        if (grads[i]) wc[i] = conjugated_for_gradient(without_node(made_again(w[i])));
      // Part p's addend: the sum over the results of their gradient's rows times their weight.
      X dx = ring_reduce_scattered<D, X>(x.mesh(), x.extents(), ring, [&](int p) {
        std::optional<G> sum;
        for (std::size_t i = 0; i < N; ++i) {
          if (!grads[i]) continue;
          G term = contract<Xd, false>(rows(*grads[i], ring, p), *wc[i]);
          if (sum)
            accumulate_kernel<typename X::execution_space>(sum->view(), term.view());
          else
            sum = std::move(term);
        }
        return *sum;
      });
      push_partial_grad(x, std::move(dx), axis_set(contracted_axes<Xd, R, W>() & ~ring.axes.mask()));
    }
    // The weights' gradients: x's parts passed around the ring once more, each part's products
    // with every result's rows of it. In an input-gradient pass (autodiff/split_backward.hpp) the
    // deferred weights' share one ring in the weight pass, the others' one ring now.
    std::array<bool, N> later{};
    if (const auto* d = weight_deferral::active())
      for (std::size_t i = 0; i < N; ++i) later[i] = w[i].tracks_grad() && d->weights.count(w[i].node()) != 0;
    for (const bool deferred : {false, true}) {
      std::array<bool, N> these{};
      std::size_t first = N;
      for (std::size_t i = 0; i < N; ++i) {
        these[i] = grads[i] && w[i].tracks_grad() && later[i] == deferred;
        if (these[i] && first == N) first = i;
      }
      if (first == N) continue;
      push_weight_grad(w[first], [x = without_node(made_again(x)), w = w, ring = ring, grads = grads, these] {
        for_each_part_gathered<D, G>(x, ring, [&](const G& part, int p) {
          const G xc = conjugated_for_gradient(part);
          for (std::size_t i = 0; i < N; ++i)
            if (these[i])
              push_product_grad<Wd>(w[i], xc, rows(*grads[i], ring, p), contracted_axes<Wd, G, R>());
        });
      });
    }
  }
};

// One result's rule: its gradient, then the backward pass.
template <class State, Tensor R>
struct gathered_product_rule {
  std::shared_ptr<State> state;
  void operator()(const R& g) const {
    state->grads[0] = without_node(g);
    state->backward();
  }
};

// The results' shared node: recorded before them, so its rule runs after theirs, when each has
// left its gradient (a node runs once every node that reads it has run: tape.hpp).
template <class State, Tensor Hub>
struct gathered_hub_rule {
  std::shared_ptr<State> state;
  void operator()(const Hub&) const { state->backward(); }
};
// A result's rule: leaves its gradient, and gives the hub one so that the hub's rule runs.
template <class State, Tensor R, Tensor Hub>
struct gathered_result_rule {
  std::shared_ptr<State> state;
  std::size_t i;
  Hub hub;
  void operator()(const R& g) const {
    state->grads[i] = without_node(g);
    push_fresh_grad(hub, Hub(hub.mesh(), hub.extents()));
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

// Several products of the same gathered x, one ring for all (attention's q, k and v): the results
// in the weights' order. Communication: P - 1 shifts forward, 2 (P - 1) backward, whatever N.
template <Tensor G, Dim... Out, Tensor X, Tensor W, std::size_t N>
std::array<detail::with_dims_t<G, type_list<Out...>>, N> einsum_gathered_each(const X& x, const std::array<W, N>& ws) {
  using OutList = type_list<Out...>;
  using R = detail::with_dims_t<G, OutList>;
  using Results = std::array<R, N>;
  constexpr int at = detail::gathered_dim_of<G, X>();
  static_assert(N >= 1, "meshtensor: einsum_gathered_each: no weight");
  if constexpr (at < 0) {
    (void)sizeof(diagnostic::einsum_gathered_not_one_dim_gathered<G, X>);
    return Results{};
  } else if constexpr (!detail::einsum_types_ok<OutList, G, W>()) {
    return Results{};
  } else {
    using D = typename detail::nth_dim<static_cast<std::size_t>(at), typename X::dims>::type;
    constexpr unsigned ring_axes = X::splits[static_cast<std::size_t>(at)].mask();
    if constexpr (!contains_v<D, OutList> || contains_v<D, typename W::dims>) {
      (void)sizeof(diagnostic::einsum_gathered_dim_not_in_result_alone<D>);
      return Results{};
    } else if constexpr (detail::contracted_axes<OutList, G, W>() != 0) {
      (void)sizeof(diagnostic::einsum_gathered_contracts_split_dim<G, W>);
      return Results{};
    } else if constexpr ((detail::contracted_axes<typename X::dims, R, W>() & ring_axes) != ring_axes) {
      (void)sizeof(diagnostic::einsum_gathered_gradient_not_over_ring<X, W>);
      return Results{};
    } else {
      for (const W& w : ws) detail::check_shared_extents("einsum_gathered", x, w);
      const ring_parts ring = detail::ring_parts_along<D>(x);
      const detail::op_call call(
          detail::planned_op{"einsum_gathered", comm_plan{}.then(collective::shift, ring.axes, ring.parts - 1)}, x);
      Results out;
      for (std::size_t i = 0; i < N; ++i) out[i] = R(x.mesh(), detail::result_extents<R>(x, ws[i]), uninitialized);
      detail::for_each_part_gathered<D, G>(x, ring, [&](const G& part, int p) {
        for (std::size_t i = 0; i < N; ++i)
          detail::put_part_rows<D>(detail::contract<OutList, false>(part, ws[i]), out[i],
                                   ring.offset[static_cast<std::size_t>(p)]);
      });
      using State = detail::gathered_products<OutList, D, G, X, W, N>;
      std::array<W, N> kept;
      for (std::size_t i = 0; i < N; ++i) kept[i] = detail::kept_for_backward(ws[i]);
      const auto state = std::make_shared<State>(State{detail::kept_for_backward(x), kept, ring, {}});
      if constexpr (N == 1) {
        detail::record<R>(out[0], detail::gathered_product_rule<State, R>{state}, x, ws[0]);
      } else {
        // The results' shared node (a scalar), whose rule runs the backward pass once all of theirs
        // have left their gradients.
        using Hub = detail::with_dims_t<G, type_list<>>;
        Hub hub(x.mesh(), {});
        std::apply([&](const auto&... w) { detail::record<Hub>(hub, detail::gathered_hub_rule<State, Hub>{state}, x, w...); },
                   ws);
        for (std::size_t i = 0; i < N; ++i)
          detail::record<R>(out[i], detail::gathered_result_rule<State, R, Hub>{state, i, hub}, hub);
      }
      return out;
    }
  }
}

template <Tensor G, Dim... Out, Tensor X, Tensor W>
detail::with_dims_t<G, type_list<Out...>> einsum_gathered(const X& x, const W& w) {
  return einsum_gathered_each<G, Out...>(x, std::array<W, 1>{w})[0];
}

}  // namespace meshtensor
