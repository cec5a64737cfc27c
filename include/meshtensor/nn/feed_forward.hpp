#pragma once
// feed_forward<DModel, DFf>(x, w_in[DModel, DFf], w_out[DFf, DModel]): Mesh-TensorFlow's
// dense_relu_dense, y = relu(x w_in) w_out, x and y over the same dims. With d_ff split over a
// mesh axis (model parallelism, as in the paper) the first product communicates nothing and the
// second allreduces over d_ff's axes; with d_model split, the first allreduces over its axes.
// Gradient: through x and both weights.
#include "../ops/einsum.hpp"
#include "../ops/partial_sum.hpp"
#include "../ops/elementwise.hpp"
#include "dense.hpp"

namespace meshtensor::nn {

template <Dim DModel, Dim DFf, Tensor X, Tensor W1, Tensor W2>
X feed_forward(const X& x, const W1& w_in, const W2& w_out) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"feed_forward"});
  const auto h = relu(dense<DModel, DFf>(x, w_in));
  return dense<DFf, DModel>(h, w_out);
}

// feed_forward with the second product's allreduce (over d_ff's axes) left pending: a partial_sum
// (ops/partial_sum.hpp).
template <Dim DModel, Dim DFf, Tensor X, Tensor W1, Tensor W2>
auto feed_forward_partial(const X& x, const W1& w_in, const W2& w_out) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"feed_forward"});
  const auto h = relu(dense<DModel, DFf>(x, w_in));
  return [&]<class... Ds>(type_list<Ds...>) { return einsum_partial<Ds...>(h, w_out); }(typename X::dims{});
}

// gated_feed_forward<DModel, DFf>(x, w_gate, w_up[DModel, DFf], w_down[DFf, DModel]): Llama's
// SwiGLU (Shazeer 2020), y = (silu(x w_gate) * (x w_up)) w_down: three matrices where
// feed_forward has two. Communication as feed_forward's: with d_ff split over a mesh axis the two
// first products communicate nothing, the gate's product is local, and the last product allreduces
// over d_ff's axes. Gradient: through x and the three weights.
template <Dim DModel, Dim DFf, Tensor X, Tensor W1, Tensor W2>
X gated_feed_forward(const X& x, const W1& w_gate, const W1& w_up, const W2& w_down) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"gated_feed_forward"});
  const auto h = silu(dense<DModel, DFf>(x, w_gate)) * dense<DModel, DFf>(x, w_up);
  return dense<DFf, DModel>(h, w_down);
}

}  // namespace meshtensor::nn
