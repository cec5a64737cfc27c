#pragma once
// all_to_all_causal_attention<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv, wo): causal
// attention of a sequence split over mesh axes (context parallelism as DeepSpeed-Ulysses does it).
// x's Length is split over axes A (its layout's rule); q, k and v are computed where the positions
// are, each moved to Heads split over A as well (Heads' own axes first, then A) with Length whole,
// attended locally over every position, and the heads' outputs moved back to Length split over A
// before the output projection. The result is causal_attention's under x's layout.
// Communication: four alltoalls over A forward (q, k, v, the output), four back; the output
// projection allreduces over Heads' own axes, as causal_attention's. Nothing is gathered: each
// processor holds the whole sequence of |Heads| / (its heads' parts) heads at a time, so the
// degree of the split is capped by the heads (parts beyond them hold no head and idle).
// attention_memory::recompute_core keeps q, k and v only, as for causal_attention.
// all_to_all_grouped_causal_attention<Length, MemLength, DModel, KvHeads, Group, DKv>: the same for
// grouped-query attention (grouped_causal_attention's weights), the split moved onto KvHeads; its
// rope form rotates q and k (nn/rope.hpp) where the positions are, before they move.
// Gradient: through x and every weight (the relayouts' gradients are the relayouts back).
#include "../ops/gather_for_use.hpp"
#include "../ops/relayout.hpp"
#include "attention.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Length>
struct context_attention_needs_a_split_length {
  static_assert(sizeof(Length) == 0,
                "meshtensor: all-to-all attention (all_to_all_causal_attention, all_to_all_grouped_causal_attention) "
                "moves the sequence's split to the heads; x's layout does not split Length: use causal_attention "
                "or grouped_causal_attention");
};
template <class MemLength>
struct context_attention_memory_length_split {
  static_assert(sizeof(MemLength) == 0,
                "meshtensor: all-to-all attention attends over the whole memory length on each "
                "processor; the layout must not split MemLength");
};
}  // namespace diagnostic

namespace detail {
// The layout L with Length's split moved onto Heads: Heads keeps its own axes and takes Length's
// after them; Length is whole.
template <class L, class Length, class Heads>
struct length_split_to_heads;
template <class Mesh, class... Rules, class Length, class Heads>
struct length_split_to_heads<layout<Mesh, Rules...>, Length, Heads> {
  using length_axes = typename layout<Mesh, Rules...>::template axes_of<Length>;
  using heads_axes = typename layout<Mesh, Rules...>::template axes_of<Heads>;
  template <class HA, class LA>
  struct heads_rule;
  template <class... HA, class... LA>
  struct heads_rule<type_list<HA...>, type_list<LA...>> {
    using type = split<Heads, HA..., LA...>;
  };
  // The rules other than Length's and Heads', then Heads' new one.
  template <class Acc, class... Rs>
  struct keep;
  template <class... Kept>
  struct keep<type_list<Kept...>> {
    using type = layout<Mesh, Kept..., typename heads_rule<heads_axes, length_axes>::type>;
  };
  template <class... Kept, class R, class... Rs>
  struct keep<type_list<Kept...>, R, Rs...> {
    using type = typename std::conditional_t<std::is_same_v<typename R::dim, Length> || std::is_same_v<typename R::dim, Heads>,
                                             keep<type_list<Kept...>, Rs...>, keep<type_list<Kept..., R>, Rs...>>::type;
  };
  using type = typename keep<type_list<>, Rules...>::type;
};
template <class L, class Length, class Heads>
using length_split_to_heads_t = typename length_split_to_heads<L, Length, Heads>::type;

// The heads' outputs of attention by all-to-all, back under x's layout (Length split), before the
// output projection. q's heads are QHeads, k's and v's KvHeads (as attention_heads_of); Length's
// split moves onto Moved (the first of KvHeads: every q head then sits with its k and v head).
template <Dim Length, Dim MemLength, class QHeads, class KvHeads, Dim Moved, Dim DKv, Tensor X, Tensor WQ, Tensor WK>
auto all_to_all_heads_of(const X& x, const WQ& wq, const WK& wk, const WK& wv, nn::attention_memory memory,
                         const nn::rope_config* rope = nullptr) {
  using L1 = typename X::layout_type;
  using L2 = length_split_to_heads_t<L1, Length, Moved>;
  using B = difference_t<typename X::dims, concat_t<type_list<Length>, difference_t<typename WQ::dims, concat_t<QHeads, type_list<DKv>>>>>;
  using QDims = concat_t<B, concat_t<QHeads, type_list<Length, DKv>>>;
  using KDims = concat_t<B, concat_t<KvHeads, type_list<Length, DKv>>>;
  using LDims = concat_t<B, concat_t<QHeads, type_list<Length, MemLength>>>;
  const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
  // Computed where the positions are (local: Length split, the heads as in x's layout), q and k
  // rotated there (rope, at their global positions), then moved.
  const auto project = [&]<class... Ds>(type_list<Ds...>, const auto& w, const nn::rope_config* rotation) {
    const auto here = with_positions<Length, DKv>(meshtensor::einsum<Ds...>(x, w), rotation);
    return meshtensor::relayout<with_layout_t<decltype(here), L2>>(here);
  };
  const auto q = project(QDims{}, wq, rope);
  const auto k = meshtensor::rename<Length, MemLength>(project(KDims{}, wk, rope));  // Length whole under L2: a local rename
  const auto v = meshtensor::rename<Length, MemLength>(project(KDims{}, wv, nullptr));
  const auto o = causal_core<Length, MemLength, LDims, QDims>(q, k, v, scale, memory);
  return meshtensor::relayout<with_layout_t<std::remove_cvref_t<decltype(o)>, L1>>(o);
}

// The compile-time refusals shared by the all-to-all attentions; true when x's layout is usable.
template <Dim Length, Dim MemLength, class L>
constexpr bool all_to_all_layout_usable() {
  if constexpr (std::is_same_v<typename L::template axes_of<Length>, type_list<>>) {
    (void)sizeof(diagnostic::context_attention_needs_a_split_length<Length>);
    return false;
  } else if constexpr (!std::is_same_v<typename L::template axes_of<MemLength>, type_list<>>) {
    (void)sizeof(diagnostic::context_attention_memory_length_split<MemLength>);
    return false;
  } else {
    return true;
  }
}

// The grouped all-to-all attention, with or without rope (nullptr).
template <Dim Length, Dim MemLength, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK, Tensor WO>
X all_to_all_grouped_of(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo, nn::attention_memory memory,
                        const nn::rope_config* rope) {
  if constexpr (!all_to_all_layout_usable<Length, MemLength, typename X::layout_type>()) {
    return x;
  } else {
    const op_call call(composite_op{"all_to_all_grouped_causal_attention"});
    const auto back = all_to_all_heads_of<Length, MemLength, type_list<KvHeads, Group>, type_list<KvHeads>, KvHeads, DKv>(
        x, wq, wk, wv, memory, rope);
    return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(back, wo); }(typename X::dims{});
  }
}
}  // namespace detail

namespace nn {

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
X all_to_all_causal_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo,
                              attention_memory memory = attention_memory::keep_all) {
  namespace md = meshtensor::detail;
  if constexpr (!md::all_to_all_layout_usable<Length, MemLength, typename X::layout_type>()) {
    return x;
  } else {
    const md::op_call call(md::composite_op{"all_to_all_causal_attention"});
    const auto back =
        md::all_to_all_heads_of<Length, MemLength, type_list<Heads>, type_list<Heads>, Heads, DKv>(x, wq, wk, wv, memory);
    return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(back, wo); }(typename X::dims{});
  }
}

// Grouped-query attention (grouped_causal_attention's weights and result) by all-to-all: Length's
// split moves onto KvHeads, so each processor attends for whole KV heads and their groups; the
// degree of the split is capped by the KV heads. Communication: four alltoalls over Length's axes
// forward (q, k, v, the output; k's and v's Group times smaller than q's), four back.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK, Tensor WO>
X all_to_all_grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo,
                                      attention_memory memory = attention_memory::keep_all) {
  return meshtensor::detail::all_to_all_grouped_of<Length, MemLength, KvHeads, Group, DKv>(x, wq, wk, wv, wo, memory,
                                                                                          nullptr);
}

// With rotary position embeddings (grouped_causal_attention's rope form): q and k rotated where
// the positions are, before they move.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK, Tensor WO>
X all_to_all_grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo,
                                      const rope_config& rope, attention_memory memory = attention_memory::keep_all) {
  return meshtensor::detail::all_to_all_grouped_of<Length, MemLength, KvHeads, Group, DKv>(x, wq, wk, wv, wo, memory,
                                                                                          &rope);
}

}  // namespace nn
}  // namespace meshtensor
