#pragma once
// Multi-head attention, Mesh-TensorFlow's, without biases. With B the dims of x other than Length
// and DModel (e.g. batch):
//   q[B, Heads, Length, DKv]       = x wq[DModel, Heads, DKv]
//   k, v[B, Heads, MemLength, DKv] = memory wk, wv          (memory[B, MemLength, DModel])
//   logits[B, Heads, Length, MemLength] = q . k (+ key_bias[.., MemLength])
//   o = softmax_MemLength(logits / sqrt(|DKv|)) . v;   y[x's dims] = o wo[Heads, DKv, DModel]
// causal_attention<Length, MemLength, ...>(x, wq, wk, wv, wo): self-attention (memory is x renamed)
// with a causal mask: weight 0 where the memory position is after the query position. Its
// key_bias form, causal_attention(x, wq, wk, wv, wo, key_bias[, memory]) (grouped_causal_attention's
// too), adds a bias per key as attention's does, before the scale (a padded batch of a decoder).
// attention<Length, MemLength, ...>(x, memory, wq, wk, wv, wo[, key_bias]): no causal mask; memory
// is the encoder's output for a decoder's cross-attention, or x renamed (self_attention) in an
// encoder. key_bias (e.g. [batch, MemLength], 0 for a real position and a large negative number for
// padding: padding_bias) is added to the logits, so padded keys get weight 0 whatever the query.
// Heads may be split over a mesh axis (model parallelism, as in the paper): then q, k, v, the
// logits and o need no communication and the output product allreduces over Heads' axes. With B
// split (data parallelism) nothing is communicated forward; weight gradients allreduce over B's
// axes. Length and MemLength must not be split (a key's softmax needs every key of its row: a split
// MemLength would allreduce the softmax's statistics; not supported by causal_attention).
// grouped_causal_attention's rope form, (x, wq, wk, wv, wo, rope_config[, memory]), rotates q and
// k at their global positions (nn/rope.hpp) before the scores, as Llama does.
// Gradient: through x, memory and every weight (not key_bias: a constant).
#include <cmath>

#include "../autodiff/recompute.hpp"
#include "../ops/einsum.hpp"
#include "../ops/einsum_gathered.hpp"
#include "../ops/einsum_scattered.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/rename.hpp"
#include "../ops/softmax.hpp"
#include "../tensor/init.hpp"
#include "rope.hpp"

namespace meshtensor::nn {

// mask[Length, MemLength]: 0 where the memory position is at or before the query position, else
// `masked` (a large negative number).
// The return type is spelled out: nvcc allows no device lambda in a function with a deduced one.
template <class Like, Dim Length, Dim MemLength>
meshtensor::detail::with_dims_t<Like, type_list<Length, MemLength>> causal_mask(const typename Like::mesh_type& m, std::int64_t n,
                                                                           typename Like::value_type masked = -1e9) {
  using M = meshtensor::detail::with_dims_t<Like, type_list<Length, MemLength>>;
  using T = typename Like::value_type;
  return meshtensor::detail::fill_by_global_index<M>(
      m, {n, n}, KOKKOS_LAMBDA(std::int64_t g) { return (g % n) > (g / n) ? masked : T(0); });
}

// What causal attention keeps for its backward pass: what its ops keep (keep_all: q, k, v, the
// softmax's weights [.., Length, MemLength] and the products' operands), or only q, k and v of its
// core (recompute_core: the scores, the softmax and the product with v run again in the backward
// pass, as in Korthikanti et al.'s selective recomputation): no s x s tensor per head is kept, for
// one more pass over the core.
enum class attention_memory { keep_all, recompute_core };

}  // namespace meshtensor::nn

namespace meshtensor::detail {
// No key bias (attention's and causal attention's forms without one).
struct no_key_bias {};

// The core of causal attention: softmax(q . k, causal) . v, q[.., Length, DKv] and k, v[..,
// MemLength, DKv], the result over QDims. The scale and the causal mask inside the softmax's pass
// (ops/softmax.hpp): no pass for q * scale, no mask tensor and no add, no exponential of the masked
// half; the same weights. A key bias (not no_key_bias) is added to the logits before the scale, as
// attention's.
template <Dim Length, Dim MemLength, class LDims, class QDims, Tensor Q, Tensor K, class Bias = no_key_bias>
auto causal_core(const Q& q, const K& k, const K& v, double scale, nn::attention_memory memory,
                 const Bias& key_bias = {}) {
  const auto core = [scale, key_bias](const auto& q, const auto& k, const auto& v) {
    const auto logits = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(q, k); }(LDims{});
    const auto weights = [&] {
      if constexpr (std::is_same_v<Bias, no_key_bias>)
        return meshtensor::causal_softmax<Length, MemLength>(logits, scale);
      else
        return meshtensor::causal_softmax<Length, MemLength>(decltype(logits)(logits + key_bias), scale);
    }();
    return [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(weights, v); }(QDims{});
  };
  if (memory == nn::attention_memory::recompute_core) return meshtensor::recompute(core, q, k, v);
  return core(q, k, v);
}

// q or k as attention uses it: rotated along its positions' dim Position (rope) where a rotary
// configuration is given, else as projected.
template <Dim Position, Dim DKv, Tensor T>
T with_positions(const T& t, const nn::rope_config* rope) {
  return rope ? nn::rope<Position, DKv>(t, *rope) : t;
}

// causal_attention's heads' outputs [B..., QHeads..., length, d_kv], before the output projection.
// q's heads are QHeads (heads; or kv_heads, group under grouped-query attention), k's and v's
// KvHeads (heads; or kv_heads): each q head attends with the k and v of the heads it shares, the
// einsum broadcasting k and v over the group. With rope, q and k rotated (nn/rope.hpp).
template <Dim Length, Dim MemLength, class QHeads, class KvHeads, Dim DKv, Tensor X, Tensor W, Tensor WK,
          class Bias = no_key_bias>
auto attention_heads_of(const X& x, const W& wq, const WK& wk, const WK& wv, nn::attention_memory memory,
                        const Bias& key_bias = {}, const nn::rope_config* rope = nullptr) {
  using B = difference_t<typename X::dims, concat_t<type_list<Length>, difference_t<typename W::dims, concat_t<QHeads, type_list<DKv>>>>>;
  using QDims = concat_t<B, concat_t<QHeads, type_list<Length, DKv>>>;
  using KDims = concat_t<B, concat_t<KvHeads, type_list<MemLength, DKv>>>;
  using LDims = concat_t<B, concat_t<QHeads, type_list<Length, MemLength>>>;
  const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
  const auto xm = meshtensor::rename<Length, MemLength>(x);
  const auto q = with_positions<Length, DKv>(
      [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(x, wq); }(QDims{}), rope);
  const auto k = with_positions<MemLength, DKv>(
      [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(xm, wk); }(KDims{}), rope);
  const auto v = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(xm, wv); }(KDims{});
  return causal_core<Length, MemLength, LDims, QDims>(q, k, v, scale, memory, key_bias);
}

// A key bias holds MemLength, not Length (per key, whatever the query).
template <Dim Length, Dim MemLength, Tensor Bias>
constexpr void check_key_bias() {
  static_assert(contains_v<MemLength, typename Bias::dims> && !contains_v<Length, typename Bias::dims>,
                "meshtensor: attention's key_bias is per key: it holds MemLength (and dims of x such as batch), "
                "not Length");
}

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W>
auto attention_heads(const X& x, const W& wq, const W& wk, const W& wv,
                     nn::attention_memory memory = nn::attention_memory::keep_all) {
  return attention_heads_of<Length, MemLength, type_list<Heads>, type_list<Heads>, DKv>(x, wq, wk, wv, memory);
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
X causal_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo,
                   attention_memory memory = attention_memory::keep_all) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"causal_attention"});
  const auto o = meshtensor::detail::attention_heads<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv, memory);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

// With a key bias [.., MemLength] (padding_bias) added to the logits before the scale, as attention's.
template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO, Tensor Bias>
X causal_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo, const Bias& key_bias,
                   attention_memory memory = attention_memory::keep_all) {
  meshtensor::detail::check_key_bias<Length, MemLength, Bias>();
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"causal_attention"});
  const auto o = meshtensor::detail::attention_heads_of<Length, MemLength, type_list<Heads>, type_list<Heads>, DKv>(
      x, wq, wk, wv, memory, key_bias);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

// causal_attention with the output projection's allreduce (over the heads' axes) left pending: a
// partial_sum (ops/partial_sum.hpp), for a relayout that makes it a reduce_scatter (sequence
// parallelism) or a sum with other partials.
template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
auto causal_attention_partial(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo,
                              attention_memory memory = attention_memory::keep_all) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"causal_attention"});
  const auto o = meshtensor::detail::attention_heads<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv, memory);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum_partial<Ds...>(o, wo); }(typename X::dims{});
}

// causal_attention_partial's sum reduce_scattered as XS (the sequence split over the heads' axes:
// sequence parallelism), part by part around the ring of those axes with the output projection's
// products (einsum_scattered: each part's products computed while the sum of the part before
// travels). The same as relayout<XS>(causal_attention_partial(...)).
template <Tensor XS, Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
XS causal_attention_scattered(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo,
                              attention_memory memory = attention_memory::keep_all) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"causal_attention"});
  const auto o = meshtensor::detail::attention_heads<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv, memory);
  return einsum_scattered<XS>(o, wo);
}

// causal_attention under sequence parallelism with its collectives behind its products
// (Megatron-Core's --tp-comm-overlap): xs is the stream split along Length over the axes that split
// Heads, X the products' layout (Length whole). q, k and v come from one ring over xs's parts
// (einsum_gathered_each: each part's three products while the next part travels, where
// relayout_regathered would gather xs whole first), and the output projection's sum arrives as XS
// part by part with its products (einsum_scattered). The same as relayout<XS> of
// causal_attention_partial of relayout_regathered<X>(xs).
template <Tensor X, Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor XS, Tensor W, Tensor WO>
XS causal_attention_overlapped(const XS& xs, const W& wq, const W& wk, const W& wv, const WO& wo,
                               attention_memory memory = attention_memory::keep_all) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"causal_attention"});
  using B = difference_t<typename X::dims, type_list<Length, DModel>>;
  using QDims = meshtensor::detail::concat_t<B, type_list<Heads, Length, DKv>>;
  using LDims = meshtensor::detail::concat_t<B, type_list<Heads, Length, MemLength>>;
  const auto qkv = [&]<class... Ds>(type_list<Ds...>) {
    return einsum_gathered_each<X, Ds...>(xs, std::array<W, 3>{wq, wk, wv});
  }(QDims{});
  const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
  const auto o = meshtensor::detail::causal_core<Length, MemLength, LDims, QDims>(
      qkv[0], rename<Length, MemLength>(qkv[1]), rename<Length, MemLength>(qkv[2]), scale, memory);
  return einsum_scattered<XS>(o, wo);
}

// Grouped-query attention (Ainslie et al. 2023; Llama 2 70B and Llama 3): KvHeads key and value
// heads, each shared by Group query heads, so the cache and k, v are Group times smaller than
// multi-head attention's. wq[DModel, KvHeads, Group, DKv], wk and wv[DModel, KvHeads, DKv],
// wo[KvHeads, Group, DKv, DModel]; causal. Group = 1 is causal_attention; equal to it with each k
// and v head repeated Group times. Communication: KvHeads split over mesh axes (tensor parallelism
// up to the number of KV heads, as Megatron and Meta split Llama) needs none for q, k, v and the
// core, and the output product allreduces over the heads' axes; Group may be split too, k and v then
// replicated over its axes. Gradient: through x and every weight.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK, Tensor WO>
X grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo,
                           attention_memory memory = attention_memory::keep_all) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"grouped_causal_attention"});
  const auto o = meshtensor::detail::attention_heads_of<Length, MemLength, type_list<KvHeads, Group>, type_list<KvHeads>, DKv>(
      x, wq, wk, wv, memory);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

// With rotary position embeddings: q and k rotated at their global positions (nn/rope.hpp; DKv
// must not be split), as Llama's attention. Group of extent 1 is multi-head attention.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK, Tensor WO>
X grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo, const rope_config& rope,
                           attention_memory memory = attention_memory::keep_all) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"grouped_causal_attention"});
  const auto o = meshtensor::detail::attention_heads_of<Length, MemLength, type_list<KvHeads, Group>, type_list<KvHeads>, DKv>(
      x, wq, wk, wv, memory, meshtensor::detail::no_key_bias{}, &rope);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

// With a key bias [.., MemLength] added to the logits before the scale, as attention's.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK,
          Tensor WO, Tensor Bias>
X grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo, const Bias& key_bias,
                           attention_memory memory = attention_memory::keep_all) {
  meshtensor::detail::check_key_bias<Length, MemLength, Bias>();
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"grouped_causal_attention"});
  const auto o = meshtensor::detail::attention_heads_of<Length, MemLength, type_list<KvHeads, Group>, type_list<KvHeads>, DKv>(
      x, wq, wk, wv, memory, key_bias);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

}  // namespace meshtensor::nn

namespace meshtensor::detail {
// attention's heads' outputs [B..., Heads, Length, DKv] before the output projection, with or
// without a key bias (Bias = no_key_bias: none).
template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor M, Tensor W, class Bias>
auto attention_heads_over(const X& x, const M& memory, const W& wq, const W& wk, const W& wv, const Bias& key_bias) {
  static_assert(!std::is_same_v<Length, MemLength>,
                "meshtensor: attention<Length, MemLength, ...>: the queries' and the keys' positions need two "
                "different dims (rename the memory's: mt::rename<Length, MemLength>(x))");
  static_assert(contains_v<MemLength, typename M::dims> && !contains_v<Length, typename M::dims>,
                "meshtensor: attention<Length, MemLength, ...>: the memory (keys and values) must hold MemLength "
                "in place of Length");
  using B = difference_t<typename X::dims, type_list<Length, DModel>>;
  using QDims = concat_t<B, type_list<Heads, Length, DKv>>;
  using KDims = concat_t<B, type_list<Heads, MemLength, DKv>>;
  using LDims = concat_t<B, type_list<Heads, Length, MemLength>>;
  using C = compute_t<typename X::value_type>;
  const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
  const auto q = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(x, wq); }(QDims{});
  const auto k = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(memory, wk); }(KDims{});
  const auto v = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(memory, wv); }(KDims{});
  const auto logits = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(q, k); }(LDims{});
  // The scale inside the softmax's row pass (no pass for q * scale); the bias before it (scaled
  // with the logits: a padding bias of -1e9 stays far below any logit).
  const auto weights = [&] {
    if constexpr (std::is_same_v<Bias, no_key_bias>)
      return softmax_along<false, MemLength>(logits, static_cast<C>(scale));
    else
      return softmax_along<false, MemLength>(decltype(logits)(logits + key_bias), static_cast<C>(scale));
  }();
  return [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(weights, v); }(QDims{});
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor M, Tensor W, Tensor WO>
X attention(const X& x, const M& memory, const W& wq, const W& wk, const W& wv, const WO& wo) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"attention"});
  const auto o = meshtensor::detail::attention_heads_over<Length, MemLength, DModel, Heads, DKv>(
      x, memory, wq, wk, wv, meshtensor::detail::no_key_bias{});
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor M, Tensor W, Tensor WO,
          Tensor Bias>
X attention(const X& x, const M& memory, const W& wq, const W& wk, const W& wv, const WO& wo, const Bias& key_bias) {
  meshtensor::detail::check_key_bias<Length, MemLength, Bias>();
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"attention"});
  const auto o = meshtensor::detail::attention_heads_over<Length, MemLength, DModel, Heads, DKv>(x, memory, wq, wk,
                                                                                               wv, key_bias);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

// An encoder's self-attention: every position attends to every (unpadded) position of x.
template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO, Tensor Bias>
X self_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo, const Bias& key_bias) {
  return attention<Length, MemLength, DModel, Heads, DKv>(x, rename<Length, MemLength>(x), wq, wk, wv, wo, key_bias);
}

// padding_bias<Length, MemLength>(ids, pad): per key, 0 where ids != pad and `masked` where ids ==
// pad, with ids' dims and Length renamed MemLength (e.g. ids [batch, length] -> [batch,
// memory_length]): attention's key_bias for padded sequences. Local (no communication); a
// constant (no gradient).
template <Dim Length, Dim MemLength, Tensor Ids>
auto padding_bias(const Ids& ids, typename Ids::value_type pad, typename Ids::value_type masked = -1e9) {
  const no_grad constant;
  return rename<Length, MemLength>(equal(ids, pad) * masked);
}

}  // namespace meshtensor::nn
