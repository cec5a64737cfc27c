#pragma once
// causal_attention<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv, wo): Mesh-TensorFlow's
// multi-head self-attention with a causal mask. With B the dims of x other than Length and DModel
// (e.g. batch):
//   q[B, Heads, Length, DKv]    = x wq[DModel, Heads, DKv]
//   k, v[B, Heads, MemLength, DKv] = rename<Length, MemLength>(x) wk, wv
//   logits[B, Heads, Length, MemLength] = q . k
//   o = causal_softmax<Length, MemLength>(logits / sqrt(|DKv|)) . v;   y[x's dims] = o wo[Heads, DKv, DModel]
// (causal_softmax: weight 0 where the memory position is after the query position).
// Heads may be split over a mesh axis (model parallelism, as in the paper): then q, k, v, the
// logits and o need no communication and the output product allreduces over Heads' axes. With B
// split (data parallelism) nothing is communicated forward; weight gradients allreduce over B's
// axes. Length must not be split (MemLength takes its place in k and v by a rename).
// Gradient: through x and every weight.
#include <cmath>

#include "../ops/einsum.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/rename.hpp"
#include "../ops/softmax.hpp"
#include "../tensor/init.hpp"

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

}  // namespace meshtensor::nn

namespace meshtensor::detail {
// causal_attention's heads' outputs [B..., heads, length, d_kv], before the output projection.
template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W>
auto attention_heads(const X& x, const W& wq, const W& wk, const W& wv) {
  using B = difference_t<typename X::dims, type_list<Length, DModel>>;
  using QDims = concat_t<B, type_list<Heads, Length, DKv>>;
  using KDims = concat_t<B, type_list<Heads, MemLength, DKv>>;
  using LDims = concat_t<B, type_list<Heads, Length, MemLength>>;
  const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
  const auto xm = meshtensor::rename<Length, MemLength>(x);
  const auto q = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(x, wq); }(QDims{});
  const auto k = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(xm, wk); }(KDims{});
  const auto v = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(xm, wv); }(KDims{});
  // The scale and the causal mask inside the softmax's pass (ops/softmax.hpp): no pass for q *
  // scale, no mask tensor and no add, no exponential of the masked half; the same weights.
  const auto logits = [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(q, k); }(LDims{});
  const auto weights = meshtensor::causal_softmax<Length, MemLength>(logits, scale);
  return [&]<class... Ds>(type_list<Ds...>) { return meshtensor::einsum<Ds...>(weights, v); }(QDims{});
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
X causal_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo) {
  meshtensor::detail::plan_op_scope plan_scope("causal_attention");
  const auto o = meshtensor::detail::attention_heads<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
}

// causal_attention with the output projection's allreduce (over the heads' axes) left pending: a
// partial_sum (ops/partial_sum.hpp), for a relayout that makes it a reduce_scatter (sequence
// parallelism) or a sum with other partials.
template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO>
auto causal_attention_partial(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo) {
  meshtensor::detail::plan_op_scope plan_scope("causal_attention");
  const auto o = meshtensor::detail::attention_heads<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv);
  return [&]<class... Ds>(type_list<Ds...>) { return einsum_partial<Ds...>(o, wo); }(typename X::dims{});
}

}  // namespace meshtensor::nn
