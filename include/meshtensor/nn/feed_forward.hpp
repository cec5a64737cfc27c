#pragma once
// feed_forward<DModel, DFf>(x, w_in[DModel, DFf], w_out[DFf, DModel]): Mesh-TensorFlow's
// dense_relu_dense, y = relu(x w_in) w_out, x and y over the same dims. With d_ff split over a
// mesh axis (model parallelism, as in the paper) the first product communicates nothing and the
// second allreduces over d_ff's axes; with d_model split, the first allreduces over its axes.
// Gradient: through x and both weights.
#include "../ops/einsum.hpp"
#include "../ops/einsum_gathered.hpp"
#include "../ops/einsum_scattered.hpp"
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

// feed_forward under sequence parallelism with the tensor-parallel communication overlapped
// (Megatron-Core's --tp-comm-overlap): xs is the residual stream split along a dim (the sequence)
// over the axes that split DFf, X the products' layout (that dim whole). The allgather before
// the first product and the reduce_scatter after the second run part by part around the ring of
// those axes, each part's product computed while the next part travels (einsum_gathered,
// einsum_scattered); the same as relayout<XS>(feed_forward_partial(relayout_regathered<X>(xs),
// ...)), with the same bytes moved, in P - 1 hops each way instead of one collective.
template <Tensor X, Dim DModel, Dim DFf, Tensor XS, Tensor W1, Tensor W2>
XS feed_forward_overlapped(const XS& xs, const W1& w_in, const W2& w_out) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"feed_forward"});
  using HDims = meshtensor::detail::replace_dim_t<DModel, DFf, typename X::dims>;
  const auto h = relu([&]<class... Ds>(type_list<Ds...>) { return einsum_gathered<X, Ds...>(xs, w_in); }(HDims{}));
  return einsum_scattered<XS>(h, w_out);
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
