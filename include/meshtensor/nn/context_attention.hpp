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
// Gradient: through x and every weight (the relayouts' gradients are the relayouts back).
#include "../ops/gather_for_use.hpp"
#include "../ops/relayout.hpp"
#include "attention.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Length>
struct context_attention_needs_a_split_length {
  static_assert(sizeof(Length) == 0,
                "meshtensor: all_to_all_causal_attention moves the sequence's split to the heads; x's layout "
                "does not split Length: use causal_attention");
};
template <class MemLength>
struct context_attention_memory_length_split {
  static_assert(sizeof(MemLength) == 0,
                "meshtensor: all_to_all_causal_attention attends over the whole memory length on each "
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
}  // namespace detail

namespace nn {

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
X all_to_all_causal_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo,
                              attention_memory memory = attention_memory::keep_all) {
  using L1 = typename X::layout_type;
  if constexpr (std::is_same_v<typename L1::template axes_of<Length>, type_list<>>) {
    (void)sizeof(diagnostic::context_attention_needs_a_split_length<Length>);
    return x;
  } else if constexpr (!std::is_same_v<typename L1::template axes_of<MemLength>, type_list<>>) {
    (void)sizeof(diagnostic::context_attention_memory_length_split<MemLength>);
    return x;
  } else {
    namespace md = meshtensor::detail;
    const md::op_call call(md::composite_op{"all_to_all_causal_attention"});
    using L2 = md::length_split_to_heads_t<L1, Length, Heads>;
    using B = difference_t<typename X::dims, type_list<Length, DModel>>;
    using QDims = md::concat_t<B, type_list<Heads, Length, DKv>>;
    using KDims = md::concat_t<B, type_list<Heads, MemLength, DKv>>;
    using LDims = md::concat_t<B, type_list<Heads, Length, MemLength>>;
    const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
    // Computed where the positions are (local: Length split, Heads as in x's layout), then moved.
    const auto project = [&](const W& w) {
      const auto here = [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(x, w); }(QDims{});
      return relayout<with_layout_t<decltype(here), L2>>(here);
    };
    const auto q = project(wq);
    const auto k = rename<Length, MemLength>(project(wk));  // Length whole under L2: a local rename
    const auto v = rename<Length, MemLength>(project(wv));
    const auto o = md::causal_core<Length, MemLength, LDims, QDims>(q, k, v, scale, memory);
    const auto back = relayout<with_layout_t<std::remove_cvref_t<decltype(o)>, L1>>(o);
    return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(back, wo); }(typename X::dims{});
  }
}

}  // namespace nn
}  // namespace meshtensor
