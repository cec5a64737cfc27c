#pragma once
// rms_norm<Ds...>(x, scale, eps): Llama's normalisation (Zhang and Sennrich 2019), over the dims Ds
// (usually d_model), y = x / sqrt(mean(x^2) + eps) * scale, mean over Ds. No centring and no bias:
// one statistic where layer_norm has two. scale holds dims among Ds (usually exactly Ds).
// Communication: one allreduce (the mean square) over the axes that split Ds, none when Ds are not
// split; the gradient its transpose, and scale's gradient one allreduce over the axes that split
// x's other dims (as any broadcast operand's). Gradient: through x and scale.
// Composed of the recording ops (a square, a mean, an rsqrt and two products); layer_norm's fused
// row kernels are the model for a fused form when it shows in a profile.
#include "../ops/elementwise.hpp"
#include "../ops/reductions.hpp"

namespace meshtensor::nn {

template <Dim... Ds, Tensor X, Tensor S>
X rms_norm(const X& x, const S& scale, typename X::value_type eps = 1e-6) {
  static_assert(sizeof...(Ds) > 0, "meshtensor::nn::rms_norm<Dims...> needs the dims to normalise over");
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"rms_norm"});
  return x * rsqrt(reduce_mean<Ds...>(square(x)) + eps) * scale;
}

}  // namespace meshtensor::nn
