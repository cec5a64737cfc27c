#pragma once
// Dense (fully connected) layers, by name: dense<In, Out>(x, w[, b]) replaces x's dim In by Out,
//   y[..., Out] = sum_In x[..., In] w[In, Out] (+ b[Out]).
// w may hold more dims than In and Out (they are contracted unless x has them).
// Communication: einsum's (one allreduce over the axes splitting In, when it is split); the bias
// add none. Gradients: einsum's and the broadcast add's.
// Initialisers: normal with stddev 1/sqrt(fan_in), counter-based (the same under every layout).
#include <cmath>
#include <cstdint>

#include "../ops/einsum.hpp"
#include "../ops/elementwise.hpp"
#include "../tensor/init.hpp"

namespace meshtensor::detail {
template <class In, class Out, class D>
using swap_one = std::conditional_t<std::is_same_v<D, In>, Out, D>;
template <class In, class Out, class List>
struct replace_dim;
template <class In, class Out, class... Ds>
struct replace_dim<In, Out, type_list<Ds...>> {
  using type = type_list<swap_one<In, Out, Ds>...>;
};
template <class In, class Out, class List>
using replace_dim_t = typename replace_dim<In, Out, List>::type;
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <Dim In, Dim Out, Tensor X, Tensor W>
auto dense(const X& x, const W& w) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"dense"});
  static_assert(contains_v<In, typename X::dims>, "meshtensor::nn::dense<In, Out>: x has no dim In");
  static_assert(contains_v<In, typename W::dims> && contains_v<Out, typename W::dims>,
                "meshtensor::nn::dense<In, Out>: the weight must hold dims In and Out");
  using OutDims = detail::replace_dim_t<In, Out, typename X::dims>;
  return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(x, w); }(OutDims{});
}

template <Dim In, Dim Out, Tensor X, Tensor W, Tensor B>
auto dense(const X& x, const W& w, const B& b) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"dense"});
  return dense<In, Out>(x, w) + b;
}

// Normal(0, 1/sqrt(fan_in)) where fan_in is the product of the extents of the dims FanIn...
template <Tensor W, Dim... FanIn>
W normal_fan_in(const typename W::mesh_type& m, const typename W::extents_type& extents, std::uint64_t seed) {
  W probe(m, extents);  // checks extents against the layout
  const double fan_in = static_cast<double>((std::int64_t{1} * ... * probe.template extent<FanIn>()));
  return random_normal<W>(m, extents, seed, 0.0, 1.0 / std::sqrt(fan_in));
}

}  // namespace meshtensor::nn
