#pragma once
// layer_norm<Ds...>(x, scale, bias, eps): normalised over the dims Ds (usually d_model),
//   y = (x - mean) / sqrt(var + eps) * scale + bias,  mean and var over Ds (biased variance).
// scale and bias hold dims among Ds (usually exactly Ds). Communication: two allreduces (mean and
// variance) over the axes that split Ds, none when Ds are not split; the gradient (composed from
// the recording ops) the transposes of those. Gradient: through every input.
#include "../ops/elementwise.hpp"
#include "../ops/reductions.hpp"

namespace meshtensor::nn {

template <Dim... Ds, Tensor X>
X normalize(const X& x, typename X::value_type eps = 1e-6) {
  static_assert(sizeof...(Ds) > 0, "meshtensor::nn::layer_norm<Dims...> needs the dims to normalise over");
  const auto mean = reduce_mean<Ds...>(x);
  const X centered = x - mean;
  const auto var = reduce_mean<Ds...>(square(centered));
  return centered * rsqrt(var + eps);
}

template <Dim... Ds, Tensor X, Tensor S, Tensor B>
X layer_norm(const X& x, const S& scale, const B& bias, typename X::value_type eps = 1e-6) {
  return normalize<Ds...>(x, eps) * scale + bias;
}

}  // namespace meshtensor::nn
