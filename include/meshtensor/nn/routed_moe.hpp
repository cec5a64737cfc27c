#pragma once
// Mixture of experts as today's models route it (Mixtral 8x7B; DeepSeek-V3): top-k routing over
// many fine-grained SwiGLU experts, shared experts beside the routed ones, and DeepSeek's
// bias-based load balancing beside the auxiliary loss.
//
//   auto r = nn::routed_moe<dims>(x, w_router, router_bias, w_gate, w_up, w_down, {.top_k = 8});
//   auto r = nn::routed_moe<dims>(x, ..., options, nn::shared_experts{ws_gate, ws_up, ws_down});
//   r.y, r.aux_loss, r.load (tokens that chose each expert), r.routed (of them, those its buffer kept)
//   nn::update_router_bias(router_bias, r.load, 1e-3);  // after the step, off the tape
//
// x[Group, Token, DModel], tokens in groups as for nn::moe (moe.hpp: the dims, their two names for
// the experts, and the layout it is made for, `split<Group, A>, split<Experts, A>`: the dispatch
// and the return are then one alltoall over A each). Per token:
//   scores = softmax or sigmoid of x w_router            [unsplit<Experts>]
//   chosen = the top_k experts of scores + router_bias   (the bias steers the choice only)
//   weight = the chosen scores, over their sum when normalize_weights, times weight_scale
//   y      = sum over chosen e of weight_e * w_down[e] (silu(x w_gate[e]) * (x w_up[e]))
//            (+ the shared experts' SwiGLU of x, every token through them)
// An expert's buffer holds `capacity` tokens of a group, filled in routing order (every token's
// first choice in token order, then every second choice, ...); a choice past it is dropped.
// capacity = 0 is dropless: a buffer of a group's whole token count, which no expert can overflow
// since a token's k choices differ. Exact, at a cost: every buffer slot is computed (experts /
// top_k times the routed products of a ragged dispatch), and the one-hot dispatch and combine
// tensors, [Group, Token, Experts, capacity], grow with the square of the tokens per group (at
// 4096 tokens and 8 experts, 0.5 GiB each per group in float). At scale, give a capacity, or
// dispatch = moe_dispatch::ragged: dropless with none of that cost, each (token, choice) row sent
// to its expert's processor and each expert's rows one product (ragged_experts.hpp; the same
// results, to rounding).
// aux_loss, per group then averaged (DeepSeek-V3's sequence-wise balance loss with a group for a
// sequence; GShard's for top-k): sum over e of f_e P_e, f_e = experts / (top_k tokens) times the
// tokens that chose e, P_e the mean over tokens of e's score normalised over the experts. It is 1
// for a perfectly balanced router; scale it by your coefficient.
//
// Weights: w_router[DModel, unsplit<Experts>], router_bias[unsplit<Experts>] (no gradient: move
// it with update_router_bias), w_gate and w_up [Experts, DModel, DFf], w_down[Experts, DFf, DModel];
// shared experts (nn::gated_feed_forward's weights) [DModel, DFf] twice and [DFf, DModel], their
// d_ff the shared experts' count times an expert's.
//
// Communication (routed_moe_plan): nn::moe's (router, dispatch, the three expert products, return,
// combine, balance loss), an allreduce over Group's axes for each of load and routed, and the shared
// experts' products; with overlap_chunks = n, the dispatch, expert products, return and combine n
// times (on n pieces of the buffers); ragged, three alltoalls over Experts' axes (the counts, the rows
// out, the rows back) in place of the dispatch, products, return and combine, and in n chunks (of
// each processor's experts) the rows out and back once per chunk, 1 + 2 n. Gradients: through x, the router, the three expert weights and the shared
// experts' weights, by the ops used; in chunks, each chunk's alltoalls back run behind the other
// chunks' products as forward (relayout_in_flight's rule).
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "../ops/relayout_in_flight.hpp"
#include "../ops/slice.hpp"
#include "../ops/update_slice.hpp"
#include "feed_forward.hpp"
#include "moe.hpp"
#include "ragged_experts.hpp"

namespace meshtensor::nn {

enum class router_scores { softmax, sigmoid };  // Mixtral's; DeepSeek-V3's

// How tokens reach their experts. one_hot: Mesh-TensorFlow's dispatch and combine einsums over
// buffers of `capacity` slots, any layout. ragged: dropless, each (token, choice) row sent to its
// expert's processor and the experts' rows in one product each (ragged_experts.hpp); needs
// capacity = 0 (overlap_chunks cuts each processor's experts), Experts split over axes that split Group, DModel not split,
// DFf split over none of Group's axes.
enum class moe_dispatch { one_hot, ragged };

struct routed_moe_options {
  std::int64_t top_k = 2;
  router_scores scores = router_scores::softmax;
  bool normalize_weights = true;  // a token's k weights sum to 1 (before weight_scale)
  double weight_scale = 1.0;      // DeepSeek-V3's routed_scaling_factor: 2.5
  std::int64_t capacity = 0;      // tokens per expert per group; 0: dropless
  // The buffers' slots (one-hot: at most the capacity) or each processor's experts (ragged: at most
  // the fewest a processor holds) cut into this many chunks: the dispatch alltoall of the next chunk
  // and the return of the last run while a chunk's experts compute. 1: no overlap.
  std::int64_t overlap_chunks = 1;
  moe_dispatch dispatch = moe_dispatch::one_hot;
};

// nn::gated_feed_forward's three weights, applied to every token beside the routed experts.
template <Tensor W1, Tensor W2>
struct shared_experts {
  W1 gate;
  W1 up;
  W2 down;
};

template <class Y, class Loss, class Load>
struct routed_moe_result {
  Y y;
  Loss aux_loss;
  Load load;    // [unsplit<Experts>], float (double for double x): the tokens (of all groups) that chose each expert
  Load routed;  // of them, those within the expert's capacity (equal to load when dropless)
};

// The capacity for `factor` times an even share of a group's top_k * tokens choices, as
// expert_capacity_for's for top-2: at least min_capacity, at most the tokens per group.
inline std::int64_t routed_capacity_for(std::int64_t tokens_per_group, std::int64_t experts, std::int64_t top_k,
                                        double factor = 1.25, std::int64_t min_capacity = 4) {
  auto c = static_cast<std::int64_t>(std::ceil(static_cast<double>(top_k * tokens_per_group) * factor /
                                               static_cast<double>(experts)));
  if (c < min_capacity) c = min_capacity;
  return c < tokens_per_group ? c : tokens_per_group;
}

// The collectives routed_moe<Dims>(x, ...) runs forward, derived from the layout alone; Shared:
// with shared experts, whose weights' layout is X's; chunks: options.overlap_chunks (the dispatch,
// the experts' products, the return and the combine run once per chunk); dispatch: options.dispatch
// (ragged: three alltoalls over Experts' axes in place of the one-hot einsums and relayouts).
template <class Dims, Tensor X, bool Shared = false>
constexpr comm_plan routed_moe_plan(std::int64_t chunks = 1, moe_dispatch dispatch = moe_dispatch::one_hot) {
  using G = typename Dims::group;
  using S = typename Dims::token;
  using M = typename Dims::d_model;
  using F = typename Dims::d_ff;
  using E = typename Dims::experts;
  using EU = typename Dims::experts_unsplit;
  using GU = typename Dims::group_unsplit;
  using C = expert_capacity;
  using K = expert_choice;
  using WR = detail::moe_t<X, M, EU>;
  using WI = detail::moe_t<X, E, M, F>;
  using WO = detail::moe_t<X, E, F, M>;
  using Dispatch = detail::moe_t<X, G, S, EU, C>;
  using ToExperts = detail::moe_t<X, EU, G, C, M>;
  using AtExperts = detail::moe_t<X, E, GU, C, M>;
  using Hidden = detail::moe_t<X, E, GU, C, F>;
  using Balance = detail::moe_t<X, G, EU>;
  using Chosen = detail::moe_t<X, G, S, K, EU>;
  using Kept = detail::moe_t<X, G, K, S, EU>;
  using Load = detail::moe_t<X, EU>;
  comm_plan per_chunk{};
  if (chunks > 1) per_chunk.then(slice_plan<Dispatch, C>()).then(slice_plan<Dispatch, C>());
  per_chunk.then(einsum_plan<type_list<EU, G, C, M>, X, Dispatch>())
      .then(replace_dimensions_plan<ToExperts, type_list<EU, G>, type_list<E, GU>>())
      .then(einsum_plan<type_list<E, GU, C, F>, AtExperts, WI>())
      .then(einsum_plan<type_list<E, GU, C, F>, AtExperts, WI>())
      .then(einsum_plan<type_list<E, GU, C, M>, Hidden, WO>())
      .then(replace_dimensions_plan<AtExperts, type_list<E, GU>, type_list<EU, G>>())
      .then(einsum_plan<type_list<G, S, M>, ToExperts, Dispatch>());
  comm_plan p{};
  p.then(einsum_plan<type_list<G, S, EU>, X, WR>());
  if (dispatch == moe_dispatch::ragged) {
    p.then(detail::ragged_experts_plan<Dims, X>(chunks)).then(reduce_mean_plan<Balance, G, EU>()).then(reduce_plan<Load, Chosen>());
  } else {
    for (std::int64_t c = 0; c < chunks; ++c) p.then(per_chunk);
    p.then(reduce_mean_plan<Balance, G, EU>()).then(reduce_plan<Load, Chosen>()).then(reduce_plan<Load, Kept>());
  }
  if constexpr (Shared) {
    using W1 = detail::moe_t<X, M, F>;
    using W2 = detail::moe_t<X, F, M>;
    using H = detail::moe_t<X, G, S, F>;
    p.then(einsum_plan<type_list<G, S, F>, X, W1>())
        .then(einsum_plan<type_list<G, S, F>, X, W1>())
        .then(einsum_plan<type_list<G, S, M>, H, W2>());
  }
  return p;
}

}  // namespace meshtensor::nn

namespace meshtensor::detail {
template <class Dims, Tensor X, Tensor WR, Tensor B, Tensor WI, Tensor WO>
auto routed_experts(const X& x, const WR& w_router, const B& router_bias, const WI& w_gate, const WI& w_up,
                    const WO& w_down, const nn::routed_moe_options& o) {
  using G = typename Dims::group;
  using S = typename Dims::token;
  using M = typename Dims::d_model;
  using F = typename Dims::d_ff;
  using E = typename Dims::experts;
  using EU = typename Dims::experts_unsplit;
  using GU = typename Dims::group_unsplit;
  using C = nn::expert_capacity;
  using K = nn::expert_choice;
  using T = typename X::value_type;
  // The routing's counts and positions: exact integers (bf16 holds them only up to 256).
  using R = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto in_t = [](const auto& r) {
    if constexpr (std::is_same_v<R, T>) return r;
    else return cast<T>(r);
  };
  check_moe_layout<Dims, X>();
  static_assert(std::is_same_v<B, with_dims_t<X, type_list<EU>>>,
                "meshtensor::nn::routed_moe: router_bias must be [unsplit<Experts>] in x's element type and layout "
                "(keep a float bias and pass a cast of it where x is bf16)");

  const std::int64_t groups = x.template extent<G>(), tokens = x.template extent<S>();
  const std::int64_t experts = w_router.template extent<EU>(), k = o.top_k;
  if (experts < 2 || k < 1 || k > experts || o.capacity < 0 || router_bias.template extent<EU>() != experts ||
      w_gate.template extent<E>() != experts || w_up.template extent<E>() != experts ||
      w_down.template extent<E>() != experts)
    throw shape_error(cat("routed_moe: needs at least 2 experts, 1 <= top_k <= experts, capacity >= 0 and the same ",
                          "number of experts in every weight; got ", EU::name(), " = ", experts,
                          " in w_router and ", router_bias.template extent<EU>(), " in router_bias, ", E::name(),
                          " = ", w_gate.template extent<E>(), ", ", w_up.template extent<E>(), " and ",
                          w_down.template extent<E>(), " in w_gate, w_up and w_down, top_k = ", k,
                          ", capacity = ", o.capacity));
  const std::int64_t capacity = o.capacity == 0 ? tokens : o.capacity;
  const std::int64_t chunks = o.overlap_chunks;
  const bool ragged = o.dispatch == nn::moe_dispatch::ragged;
  if (ragged && o.capacity != 0)
    throw shape_error(cat("routed_moe: the ragged dispatch is dropless: it needs capacity = 0; got capacity = ",
                          o.capacity));
  if (!ragged && (chunks < 1 || chunks > capacity))
    throw shape_error(cat("routed_moe: overlap_chunks = ", chunks, " cuts an expert's buffer of ", capacity,
                          " slots (dim '", C::name(), "'", o.capacity == 0 ? ", dropless: the tokens per group" : "",
                          "); give 1 (no overlap) to ", capacity));

  // Router: scores, the choice (steered by the bias, off the tape), the chosen scores (on it).
  const auto logits = einsum<G, S, EU>(x, w_router);
  const auto scores = o.scores == nn::router_scores::softmax ? softmax<EU>(logits) : sigmoid(logits);
  const auto chosen = top_k<EU, K>(scores + router_bias, k).indices;  // [G, S, K]
  const auto choice = one_hot<EU, R>(chosen, experts);                // [G, S, K, EU], 0/1
  auto weights = reduce_sum<EU>(scores * in_t(choice));               // [G, S, K]
  if (o.normalize_weights) weights = weights / (reduce_sum<K>(weights) + static_cast<T>(1e-20));
  if (o.weight_scale != 1.0) weights = weights * static_cast<T>(o.weight_scale);

  // Balance loss: f_e P_e summed over experts, averaged over groups; the tokens that chose each expert.
  const auto balance = [&] {
    const auto f = in_t(reduce_sum<S, K>(choice) * static_cast<R>(static_cast<double>(experts) / static_cast<double>(k * tokens)));
    const auto normalised = o.scores == nn::router_scores::softmax ? scores : scores / reduce_sum<EU>(scores);
    auto aux_loss = reduce_mean<G, EU>(f * reduce_mean<S>(normalised)) * static_cast<T>(experts);
    return std::pair(std::move(aux_loss), reduce_sum<G, S, K>(choice));
  };
  using Y = moe_t<X, G, S, M>;
  using Result = nn::routed_moe_result<Y, decltype(balance().first), decltype(balance().second)>;

  if (ragged) {
    const auto ordered = [&]<class... Ds>(const auto& t, type_list<Ds...>) {
      if constexpr (std::is_same_v<typename std::decay_t<decltype(t)>::dims, type_list<Ds...>>) return t;
      else return transpose<Ds...>(t);
    };
    const auto out = ragged_experts<Dims>(ordered(x, type_list<G, S, M>{}), ordered(chosen, type_list<G, S, K>{}),
                                          ordered(w_gate, type_list<E, M, F>{}), ordered(w_up, type_list<E, M, F>{}),
                                          ordered(w_down, type_list<E, F, M>{}), chunks);
    Y y = ordered(reduce_sum<K>(out * weights), type_list<G, S, M>{});
    auto [aux_loss, load] = balance();
    auto routed = load;  // dropless: every choice is routed
    return Result{std::move(y), std::move(aux_loss), std::move(load), std::move(routed)};
  }

  // Each choice's slot in its expert's buffer: a running count in routing order.
  const auto in_order = reshape<G, nn::expert_slot, EU>(transpose<G, K, S, EU>(choice), {groups, k * tokens, experts});
  const auto position_in_order = cumsum<nn::expert_slot>(in_order) - in_order;
  const auto position = reshape<G, K, S, EU>(position_in_order, {groups, k, tokens, experts});
  const auto kept = transpose<G, K, S, EU>(choice) * less(position, static_cast<R>(capacity));
  const auto slot = reduce_sum<EU>(position * kept);                                          // [G, K, S]
  const auto dispatch_by_choice = in_t(kept * one_hot<C, R>(cast<std::int64_t>(slot), capacity));  // [G,K,S,EU,C]
  const auto dispatch = reduce_sum<K>(dispatch_by_choice);  // [G, S, EU, C]: a token's choices differ
  const auto combine = reduce_sum<K>(weights * dispatch_by_choice);

  // Tokens to their experts' SwiGLU, and back: whole, or chunk by chunk of the buffers' slots, the
  // next chunk's dispatch and the last one's return in flight while a chunk's experts compute
  // (moved on by an MPI_Test between the products).
  const auto experts_of = [&](const auto& at_experts, const auto& progress) {
    const auto gate = einsum<E, GU, C, F>(at_experts, w_gate);
    progress();
    const auto hidden = silu(gate) * einsum<E, GU, C, F>(at_experts, w_up);
    progress();
    return einsum<E, GU, C, M>(hidden, w_down);
  };
  const auto first_slot = [&](std::int64_t c) { return c * capacity / chunks; };
  const auto chunk_of = [&](const auto& t, std::int64_t c) {
    return chunks == 1 ? t : slice<C>(t, first_slot(c), first_slot(c + 1) - first_slot(c));
  };
  const auto dispatched = [&](std::int64_t c) {
    return start_replace_dimensions<type_list<EU, G>, type_list<E, GU>>(einsum<EU, G, C, M>(x, chunk_of(dispatch, c)));
  };
  const auto returned = [&](const auto& out) { return start_replace_dimensions<type_list<E, GU>, type_list<EU, G>>(out); };
  const auto combined = [&](auto& back, std::int64_t c) { return einsum<G, S, M>(back->wait(), chunk_of(combine, c)); };

  auto here = dispatched(0);
  auto next = chunks > 1 ? dispatched(1) : decltype(here){};
  auto back = returned(experts_of(here->wait(), [&] {
    if (next) next->progress();
  }));
  std::optional<decltype(combined(back, 0))> y_before;  // the chunks combined so far
  for (std::int64_t c = 1; c < chunks; ++c) {
    here = std::move(next);
    if (c + 1 < chunks) next = dispatched(c + 1);
    const auto out = experts_of(here->wait(), [&] {
      if (next) next->progress();
      back->progress();
    });
    auto part = combined(back, c - 1);
    y_before.emplace(y_before ? decltype(part)(*y_before + part) : std::move(part));
    back = returned(out);
  }
  auto last = combined(back, chunks - 1);
  Y y = y_before ? decltype(last)(*y_before + last) : std::move(last);
  auto [aux_loss, load] = balance();
  auto routed = reduce_sum<G, K, S>(kept);
  return Result{std::move(y), std::move(aux_loss), std::move(load), std::move(routed)};
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <class Dims, Tensor X, Tensor WR, Tensor B, Tensor WI, Tensor WO>
auto routed_moe(const X& x, const WR& w_router, const B& router_bias, const WI& w_gate, const WI& w_up,
                const WO& w_down, const routed_moe_options& options) {
  const meshtensor::detail::op_call call(meshtensor::detail::planned_op{"routed_moe", routed_moe_plan<Dims, X>(options.overlap_chunks, options.dispatch)}, x);
  return meshtensor::detail::routed_experts<Dims>(x, w_router, router_bias, w_gate, w_up, w_down, options);
}

template <class Dims, Tensor X, Tensor WR, Tensor B, Tensor WI, Tensor WO, Tensor W1, Tensor W2>
auto routed_moe(const X& x, const WR& w_router, const B& router_bias, const WI& w_gate, const WI& w_up,
                const WO& w_down, const routed_moe_options& options, const shared_experts<W1, W2>& shared) {
  const meshtensor::detail::op_call call(
      meshtensor::detail::planned_op{"routed_moe", routed_moe_plan<Dims, X, true>(options.overlap_chunks, options.dispatch)}, x);
  auto r = meshtensor::detail::routed_experts<Dims>(x, w_router, router_bias, w_gate, w_up, w_down, options);
  r.y = r.y + gated_feed_forward<typename Dims::d_model, typename Dims::d_ff>(x, shared.gate, shared.up, shared.down);
  return r;
}

// DeepSeek-V3's balancing without a loss: after a step, each expert's bias moves by `rate` toward
// the mean load (up where fewer tokens than the mean chose it, down where more; unchanged at the
// mean), in place (its memory and a plan's kind for it stay). Off the tape; every processor
// computes the same (load is reduced over all groups). load may be of another element type (a
// float load beside a bf16 bias).
template <Tensor B, Tensor Load>
void update_router_bias(B& router_bias, const Load& load, double rate) {
  using T = typename B::value_type;
  static_assert(Load::rank == 1 && std::is_same_v<typename B::dims, typename Load::dims>,
                "meshtensor::nn::update_router_bias: router_bias and load must both be [unsplit<Experts>]");
  if (!(rate >= 0)) throw error(meshtensor::detail::cat("update_router_bias: rate must be >= 0; got ", rate));
  const meshtensor::detail::recording_scope off(false);
  [&]<class EU>(type_list<EU>) {
    const auto below_mean = reduce_mean<EU>(load) - load;
    const auto step = greater(below_mean, typename Load::value_type(0)) - less(below_mean, typename Load::value_type(0));
    if constexpr (std::is_same_v<typename Load::value_type, T>)
      update_slice<EU>(router_bias, B(router_bias + step * static_cast<T>(rate)), 0);
    else
      update_slice<EU>(router_bias, B(router_bias + cast<T>(step) * static_cast<T>(rate)), 0);
  }(typename Load::dims{});
}

}  // namespace meshtensor::nn
