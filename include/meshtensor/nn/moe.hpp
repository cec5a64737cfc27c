#pragma once
// Mixture of experts with top-2 gating (Shazeer et al. 2017; Mesh-TensorFlow's moe.py, "v1").
//
//   auto [y, aux_loss] = nn::moe<dims>(x, w_gate, w_in, w_out, capacity);
//
// x[Group, Token, DModel]: tokens in groups (usually a batch reshaped); routing is decided within a
// group. Every token goes to the two experts with the largest gate (softmax over experts) values,
// weighted by those two values renormalised to sum 1. An expert takes at most `capacity` tokens of a
// group: first choices in token order, then second choices; a choice beyond capacity is dropped
// (the token's output from that expert is zero). Each expert is relu-ffn:
// y_e = relu(x w_in[e]) w_out[e]. aux_loss is Mesh-TensorFlow's load-balancing loss,
// mean over (group, expert) of (fraction of first choices) * (mean gate) * experts^2.
//
// Names: the experts dim has two names, as in Mesh-TensorFlow. The router works over
// unsplit<Experts> beside the (split) group dim; the experts compute over Experts beside
// unsplit<Group>. Renaming [unsplit<Experts>, Group] to [Experts, unsplit<Group>] is then a
// relayout: with a layout that splits Experts over the axes Group is split over (the layout this
// layer is made for, `split<Group, A>, split<Experts, A>`), it is one alltoall over A, and each
// processor runs its own experts on the tokens every processor sent them.
//
// Weights: w_gate[DModel, unsplit<Experts>], w_in[Experts, DModel, DFf], w_out[Experts, DFf, DModel].
// DModel and DFf may be split (model parallelism inside the experts). Token, unsplit<...>,
// expert_capacity, expert_choice and expert_slot must stay unsplit: a compile error says so.
//
// Communication (moe_plan): allreduce over DModel's axes (router); the dispatch relayout; allreduce
// over DModel's axes and over DFf's axes (the expert products); the return relayout; allreduce over
// Group's axes (aux_loss). Gradients: through x, all three weights and the gates, by the ops used.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "../ops/cast.hpp"
#include "../ops/cumsum.hpp"
#include "../ops/einsum.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/one_hot.hpp"
#include "../ops/sum_broadcast.hpp"
#include "../ops/reductions.hpp"
#include "../ops/rename.hpp"
#include "../ops/slice.hpp"
#include "../ops/softmax.hpp"
#include "../ops/top_k.hpp"

namespace meshtensor::detail {
// "<name>_unsplit", built at compile time so that run-time errors name the dim.
template <Dim D>
struct unsplit_name {
  static constexpr std::string_view suffix = "_unsplit";
  static constexpr std::size_t size = D::name().size() + suffix.size();
  static constexpr std::array<char, size> chars = [] {
    std::array<char, size> a{};
    for (std::size_t i = 0; i < D::name().size(); ++i) a[i] = D::name()[i];
    for (std::size_t i = 0; i < suffix.size(); ++i) a[D::name().size() + i] = suffix[i];
    return a;
  }();
};
}  // namespace meshtensor::detail

namespace meshtensor::nn {

// The same dim under a name that layouts leave unsplit.
template <Dim D>
struct unsplit {
  using meshtensor_dim_tag = void;
  static constexpr std::string_view name() { return {detail::unsplit_name<D>::chars.data(), detail::unsplit_name<D>::size}; }
};

struct expert_capacity : dim<"expert_capacity"> {};
struct expert_choice : dim<"expert_choice"> {};  // first or second choice of a token
struct expert_slot : dim<"expert_slot"> {};      // (choice, token) in routing order

template <Dim Group, Dim Token, Dim DModel, Dim DFf, Dim Experts>
struct moe_dims {
  using group = Group;
  using token = Token;
  using d_model = DModel;
  using d_ff = DFf;
  using experts = Experts;
  using experts_unsplit = unsplit<Experts>;
  using group_unsplit = unsplit<Group>;
};

template <class Y, class Loss>
struct moe_result {
  Y y;
  Loss aux_loss;
};

// Mesh-TensorFlow's capacity rule: ceil(2 * tokens per group * factor / experts) (two choices per
// token), at least min_capacity and at most the tokens per group.
inline std::int64_t expert_capacity_for(std::int64_t tokens_per_group, std::int64_t experts, double factor = 1.25,
                                        std::int64_t min_capacity = 4) {
  auto c = static_cast<std::int64_t>(std::ceil(2.0 * static_cast<double>(tokens_per_group) * factor /
                                               static_cast<double>(experts)));
  if (c < min_capacity) c = min_capacity;
  return c < tokens_per_group ? c : tokens_per_group;
}

}  // namespace meshtensor::nn

namespace meshtensor::diagnostic {
template <class Dim, class Layout>
struct moe_dim_must_not_be_split {
  static_assert(sizeof(Dim) == 0,
                "meshtensor::nn::moe: the layout splits a dim that moe needs whole (the token dim: routing is "
                "decided within a group, split the group dim instead; or one of moe's own dims unsplit<...>, "
                "expert_capacity, expert_choice, expert_slot); remove its split rule");
};
}  // namespace meshtensor::diagnostic

namespace meshtensor::detail {
template <class Dims, Tensor X>
constexpr void check_moe_layout() {
  using L = typename X::layout_type;
  static_assert(X::rank == 3 && contains_v<typename Dims::group, typename X::dims> &&
                    contains_v<typename Dims::token, typename X::dims> &&
                    contains_v<typename Dims::d_model, typename X::dims>,
                "meshtensor::nn::moe: x must have exactly the dims Group, Token and DModel");
  [&]<class... Ds>(type_list<Ds...>) {
    (
        [] {
          if constexpr (L::template split_of<Ds>().count != 0)
            (void)sizeof(diagnostic::moe_dim_must_not_be_split<Ds, L>);
        }(),
        ...);
  }(type_list<typename Dims::token, typename Dims::experts_unsplit, typename Dims::group_unsplit, nn::expert_capacity,
              nn::expert_choice, nn::expert_slot>{});
}

template <class X, class... Ds>
using moe_t = with_dims_t<X, type_list<Ds...>>;
}  // namespace meshtensor::detail

namespace meshtensor::nn {

// The collectives moe<Dims>(x, ...) runs forward, derived from the layout alone.
template <class Dims, Tensor X>
constexpr comm_plan moe_plan() {
  using G = typename Dims::group;
  using S = typename Dims::token;
  using M = typename Dims::d_model;
  using F = typename Dims::d_ff;
  using E = typename Dims::experts;
  using EU = typename Dims::experts_unsplit;
  using GU = typename Dims::group_unsplit;
  using C = expert_capacity;
  using WG = detail::moe_t<X, M, EU>;
  using WI = detail::moe_t<X, E, M, F>;
  using WO = detail::moe_t<X, E, F, M>;
  using Route = detail::moe_t<X, G, S, EU, C>;
  using ToExperts = detail::moe_t<X, EU, G, C, M>;
  using AtExperts = detail::moe_t<X, E, GU, C, M>;
  using Hidden = detail::moe_t<X, E, GU, C, F>;
  using Balance = detail::moe_t<X, G, EU>;
  comm_plan p{};
  p.then(einsum_plan<type_list<G, S, EU>, X, WG>())
      .then(einsum_plan<type_list<EU, G, C, M>, X, Route>())
      .then(replace_dimensions_plan<ToExperts, type_list<EU, G>, type_list<E, GU>>())
      .then(einsum_plan<type_list<E, GU, C, F>, AtExperts, WI>())
      .then(einsum_plan<type_list<E, GU, C, M>, Hidden, WO>())
      .then(replace_dimensions_plan<AtExperts, type_list<E, GU>, type_list<EU, G>>())
      .then(einsum_plan<type_list<G, S, M>, ToExperts, Route>())
      .then(reduce_mean_plan<Balance, G, EU>());
  return p;
}

template <class Dims, Tensor X, Tensor WG, Tensor WI, Tensor WO>
auto moe(const X& x, const WG& w_gate, const WI& w_in, const WO& w_out, std::int64_t capacity) {
  const meshtensor::detail::op_call call(meshtensor::detail::planned_op{"moe", moe_plan<Dims, X>()}, x);
  using G = typename Dims::group;
  using S = typename Dims::token;
  using M = typename Dims::d_model;
  using F = typename Dims::d_ff;
  using E = typename Dims::experts;
  using EU = typename Dims::experts_unsplit;
  using GU = typename Dims::group_unsplit;
  using C = expert_capacity;
  using K = expert_choice;
  using T = typename X::value_type;
  detail::check_moe_layout<Dims, X>();

  const std::int64_t groups = x.template extent<G>(), tokens = x.template extent<S>();
  const std::int64_t experts = w_gate.template extent<EU>();
  if (experts < 2 || capacity < 1 || w_in.template extent<E>() != experts || w_out.template extent<E>() != experts)
    throw shape_error(detail::cat(
        "moe: needs at least 2 experts and capacity >= 1, and the same number of experts in every weight; got ",
        EU::name(), " = ", experts, " in w_gate, ", E::name(), " = ", w_in.template extent<E>(), " in w_in and ",
        w_out.template extent<E>(), " in w_out, capacity = ", capacity));

  // Router: gates over experts, and each token's two choices.
  const auto gates = softmax<EU>(einsum<G, S, EU>(x, w_gate));
  const auto top2 = top_k<EU, K>(gates, 2);
  const auto choice = one_hot<EU, T>(top2.indices, experts);  // [G, S, K, EU], 0/1, off the tape

  // Position of each choice in its expert's buffer: a running count over the group's choices in
  // routing order (all first choices, in token order, then all second choices).
  const auto in_order =
      reshape<G, expert_slot, EU>(transpose<G, K, S, EU>(choice), {groups, 2 * tokens, experts});
  const auto position_in_order = cumsum<expert_slot>(in_order) - in_order;
  const auto position = reshape<G, K, S, EU>(position_in_order, {groups, 2, tokens, experts});
  const auto kept = transpose<G, K, S, EU>(choice) * less(position, static_cast<T>(capacity));
  const auto slot = reduce_sum<EU>(position * kept);  // [G, K, S]
  const auto dispatch_by_choice = kept * one_hot<C, T>(cast<std::int64_t>(slot), capacity);  // [G,K,S,EU,C]
  const auto dispatch = reduce_sum<K>(dispatch_by_choice);  // [G, S, EU, C]: a token's choices differ

  // Combine weights: the two gate values renormalised, on the tape (the router learns through them).
  const auto weights = top2.values / (reduce_sum<K>(top2.values) + static_cast<T>(1e-9));  // [G, S, K]
  const auto combine = reduce_sum<K>(weights * dispatch_by_choice);                       // [G, S, EU, C]

  // Tokens to their experts, and back: the two relayouts.
  const auto to_experts = einsum<EU, G, C, M>(x, dispatch);
  const auto at_experts = replace_dimensions<type_list<EU, G>, type_list<E, GU>>(to_experts);
  const auto hidden = relu(einsum<E, GU, C, F>(at_experts, w_in));
  const auto from_experts = einsum<E, GU, C, M>(hidden, w_out);
  const auto returned = replace_dimensions<type_list<E, GU>, type_list<EU, G>>(from_experts);
  auto y = einsum<G, S, M>(returned, combine);

  // Load balance: fraction of first choices per expert times the mean gate per expert.
  const auto first_choice = reduce_sum<K>(slice<K>(choice, 0, 1));
  const auto density = reduce_mean<S>(first_choice);
  const auto mean_gate = reduce_mean<S>(gates);
  auto aux_loss = reduce_mean<G, EU>(density * mean_gate) * static_cast<T>(experts * experts);
  return moe_result<decltype(y), decltype(aux_loss)>{std::move(y), std::move(aux_loss)};
}

}  // namespace meshtensor::nn
