#pragma once
// dropout(x, rate, seed, step): each element kept with probability 1 - rate and scaled by
// 1 / (1 - rate), else zeroed. The mask is a function of (seed, step, global index of the element)
// only (counter-based, as tensor/init.hpp), so it is the same under every layout and processor
// count, and differs from step to step. rate <= 0 returns x. Communication: none. Gradient: the
// same mask, drawn again in the backward kernel (ops/fused.hpp): no mask is stored.
#include <cstdint>

#include "../ops/elementwise.hpp"
#include "../ops/fused.hpp"
#include "../tensor/init.hpp"

namespace meshtensor::nn {

// The scaled mask itself: 1/(1-rate) where kept, 0 where dropped.
template <Tensor X>
X dropout_mask(const typename X::mesh_type& m, const typename X::extents_type& extents, double rate,
               std::uint64_t seed, std::uint64_t step) {
  using T = typename X::value_type;
  const T keep_scale = static_cast<T>(1.0 / (1.0 - rate));
  // Stream numbers above 2^32 keep clear of the initialisers' streams 0, 1, 2.
  const std::uint64_t stream = detail::mix64(step) | (std::uint64_t{1} << 32);
  return detail::fill_by_global_index<X>(m, extents, KOKKOS_LAMBDA(std::int64_t g) {
    return detail::uniform01(seed, static_cast<std::uint64_t>(g), stream) >= rate ? keep_scale : T(0);
  });
}

template <Tensor X>
X dropout(const X& x, double rate, std::uint64_t seed, std::uint64_t step) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"dropout"});
  if (rate <= 0) return x;
  if (rate >= 1) throw error(detail::cat("dropout: rate ", rate, " must be below 1"));
  // One fused kernel: no mask tensor, nothing kept for the backward (which draws the mask again).
  return fuse([&](auto v) { return dropout(v, rate, seed, step); }, x);
}

// x + dropout(sublayer): a residual block's output, as one fused kernel (ops/fused.hpp). The mask
// is dropout's (the same elements dropped); nothing is kept for the backward, which draws the mask
// again, where x + dropout(s) keeps s, the mask and their product.
template <Tensor X, Tensor S>
X residual_dropout(const X& x, const S& sublayer, double rate, std::uint64_t seed, std::uint64_t step) {
  static_assert(std::is_same_v<typename S::dims, typename X::dims>,
                "meshtensor::nn::residual_dropout: the sublayer's output must have the residual's dims, in its order");
  return fuse([&](auto r, auto s) { return r + dropout(s, rate, seed, step); }, x, sublayer);
}

}  // namespace meshtensor::nn
