#pragma once
// Convolutions, pools and batch normalisation over named spatial dims, built on unfold/fold
// (ops/unfold.hpp) and einsum, so that their halos, products and gradients are those ops':
//   conv<spatial<H, KH>, spatial<W, KW>>(x, filter, window_h, window_w)
//     = einsum(unfold(x), filter), summed over the dims x and the filter share (channels in) and the
//       window dims; the result has x's other dims and the filter's own (channels out).
//   conv_transpose<...>(y, filter, {H, W}, windows...): the adjoint in x of conv (a U-Net decoder's
//     upsampling with stride 2): fold(einsum(y, filter)).
//   max_pool / avg_pool<...>(x, windows...): the max or mean of each window (avg_pool counts the
//     padding's zeros, as PyTorch's count_include_pad default does; max_pool pads with -inf).
//   batch_norm<Ds...>(x, scale, bias, eps): normalised with the mean and variance over Ds (batch and
//     spatial dims: a split spatial dim's statistics are reduced across processors).
// Communication: unfold's halos (two shifts per spatial dim split over one axis), einsum's allreduce
// over the axes of split channels in, the reductions' allreduces.
#include <limits>

#include "../ops/einsum.hpp"
#include "../ops/reductions.hpp"
#include "../ops/unfold.hpp"
#include "layer_norm.hpp"

namespace meshtensor::detail {
// conv's result: x's dims the filter lacks, then the filter's dims that are neither x's nor windows.
template <Tensor X, Tensor F, class... S>
using conv_dims_t =
    union_t<difference_t<typename X::dims, typename F::dims>,
            difference_t<typename F::dims, union_t<typename X::dims, type_list<typename S::window_dim...>>>>;
// conv_transpose's result: y's dims the filter lacks, then the filter's channels in; its columns are
// in unfold's order.
template <Tensor Y, Tensor F, class... S>
using transpose_input_t = with_dims_t<
    Y, union_t<difference_t<typename Y::dims, typename F::dims>,
               difference_t<typename F::dims, union_t<typename Y::dims, type_list<typename S::window_dim...>>>>>;
template <Tensor Y, Tensor F, class... S>
using transpose_cols_dims_t = unfolded_dims_t<transpose_input_t<Y, F, S...>, S...>;

template <class... Out, Tensor A, Tensor B>
auto einsum_to(type_list<Out...>, const A& a, const B& b) {
  return einsum<Out...>(a, b);
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <class... S, Tensor X, Tensor F>
  requires(sizeof...(S) > 0)
auto conv(const X& x, const F& filter, meshtensor::detail::window_for<S>... windows) {
  static_assert((contains_v<typename S::window_dim, typename F::dims> && ...),
                "meshtensor::nn::conv: the filter needs every window dim (its taps along each spatial dim)");
  meshtensor::detail::plan_op_scope plan_scope("conv");
  return meshtensor::detail::einsum_to(meshtensor::detail::conv_dims_t<X, F, S...>{}, unfold<S...>(x, windows...), filter);
}

template <Dim H, Dim KH, Tensor X, Tensor F>
auto conv1d(const X& x, const F& filter, window w) {
  return conv<spatial<H, KH>>(x, filter, w);
}
template <Dim H, Dim W, Dim KH, Dim KW, Tensor X, Tensor F>
auto conv2d(const X& x, const F& filter, window wh, window ww) {
  return conv<spatial<H, KH>, spatial<W, KW>>(x, filter, wh, ww);
}
template <Dim D, Dim H, Dim W, Dim KD, Dim KH, Dim KW, Tensor X, Tensor F>
auto conv3d(const X& x, const F& filter, window wd, window wh, window ww) {
  return conv<spatial<D, KD>, spatial<H, KH>, spatial<W, KW>>(x, filter, wd, wh, ww);
}

// The input of conv that y came from has these spatial extents: with stride 2, extent 2n and 2n - 1
// both give n positions, so the caller says which.
template <class... S, Tensor Y, Tensor F>
  requires(sizeof...(S) > 0)
auto conv_transpose(const Y& y, const F& filter, const std::array<std::int64_t, sizeof...(S)>& spatial_extents,
                    meshtensor::detail::window_for<S>... windows) {
  meshtensor::detail::plan_op_scope plan_scope("conv_transpose");
  return fold<S...>(meshtensor::detail::einsum_to(meshtensor::detail::transpose_cols_dims_t<Y, F, S...>{}, y, filter), spatial_extents,
                    windows...);
}

template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto max_pool(const X& x, meshtensor::detail::window_for<S>... windows) {
  using T = typename X::value_type;
  meshtensor::detail::plan_op_scope plan_scope("max_pool");
  return reduce_max<typename S::window_dim...>(unfold<S...>(x, -std::numeric_limits<T>::infinity(), windows...));
}

template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto avg_pool(const X& x, meshtensor::detail::window_for<S>... windows) {
  meshtensor::detail::plan_op_scope plan_scope("avg_pool");
  return reduce_mean<typename S::window_dim...>(unfold<S...>(x, windows...));
}

// Training-mode batch normalisation: statistics of this batch over Ds (biased variance).
template <Dim... Ds, Tensor X, Tensor P>
X batch_norm(const X& x, const P& scale, const P& bias, typename X::value_type eps = 1e-5) {
  meshtensor::detail::plan_op_scope plan_scope("batch_norm");
  return normalize<Ds...>(x, eps) * scale + bias;
}

}  // namespace meshtensor::nn
