#pragma once
// Convolutions, pools and batch normalisation over named spatial dims, built on unfold/fold
// (ops/unfold.hpp) and einsum, so that their halos, products and gradients are those ops':
//   conv<spatial<H, KH>, spatial<W, KW>>(x, filter, window_h, window_w)
//     = einsum(unfold(x), filter), summed over the dims x and the filter share (channels in) and the
//       window dims; the result has x's other dims and the filter's own (channels out).
//   conv_transpose<...>(y, filter, {H, W}, windows...): the adjoint in x of conv (a U-Net decoder's
//     upsampling with stride 2): fold(einsum(y, filter)); with a provider, conv's backward data.
//   max_pool / avg_pool<...>(x, windows...): the max or mean of each window (avg_pool counts the
//     padding's zeros, as PyTorch's count_include_pad default does; max_pool pads with -inf).
//   batch_norm<Ds...>(x, scale, bias, eps): normalised with the mean and variance over Ds (batch and
//     spatial dims: a split spatial dim's statistics are reduced across processors).
// Communication: unfold's halos (two shifts per spatial dim split over one axis), einsum's allreduce
// over the axes of split channels in, the reductions' allreduces.
// Local work: where a convolution provider is built in (oneDNN, kernels/convolution.hpp) and the
// dims allow it (channels in last in x, whole; batch dims side by side; up to 3 spatial dims), conv
// runs a direct convolution on each processor's slice with its halos (the same take_halo and
// return_halo as unfold, so the same collectives) instead of unfold + product: no column buffer,
// and oneDNN's kernels. Elsewhere (doubles, a GPU, other dim orders) it is unfold + einsum.
// conv_transpose likewise runs the direct conv's backward data where channels out are unsplit.
#include <limits>

#include "../kernels/convolution.hpp"
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

// Where conv's dims sit, for a direct convolution: x = [batch dims side by side and spatial dims,
// in any order][channels in], the filter = window dims, channels in side by side in x's order,
// channels out side by side; the result = x's first dims, then channels out. ok is false where
// the dims do not allow it (conv then takes unfold + einsum).
struct direct_conv_dims {
  bool ok = false;
  std::size_t prefix = 0;                   // x's dims before channels in (the result's too)
  std::size_t batch_first = 0, batch_count = 0;
  std::array<std::size_t, 3> x_spatial{}, f_window{};
  std::size_t f_in_first = 0;               // channels in, in the filter
  std::size_t f_out_first = 0, f_out_count = 0;
  unsigned out_axes = 0, batch_spatial_axes = 0;  // split axes of channels out; of x's first dims
};
template <Tensor X, Tensor F, class... S>
constexpr direct_conv_dims direct_conv_layout_of() {
  constexpr std::size_t R = X::rank, FR = F::rank, N = sizeof...(S), P = spatial_prefix_v<X, S...>;
  direct_conv_dims l;
  if constexpr (N <= 3 && P < R) {
    const std::array<std::size_t, N> xs{X::template index_of<typename S::dim>()...};
    const std::array<std::size_t, N> fw{F::template index_of<typename S::window_dim>()...};
    const auto in_f = []<class... Ds>(type_list<Ds...>) { return std::array<std::size_t, R>{index_of_v<Ds, typename F::dims>...}; }(typename X::dims{});
    const auto in_x = []<class... Ds>(type_list<Ds...>) { return std::array<bool, FR>{contains_v<Ds, typename X::dims>...}; }(typename F::dims{});
    const auto x_mask = []<class... Ds>(type_list<Ds...>) { return std::array<unsigned, R>{X::layout_type::template split_of<Ds>().mask()...}; }(typename X::dims{});
    const auto f_mask = []<class... Ds>(type_list<Ds...>) { return std::array<unsigned, FR>{F::layout_type::template split_of<Ds>().mask()...}; }(typename F::dims{});
    auto is_spatial = [&](std::size_t i) { for (auto p : xs) if (p == i) return true; return false; };
    auto is_window = [&](std::size_t i) { for (auto p : fw) if (p == i) return true; return false; };
    bool ok = true;
    // Channels in: x's dims from P on, whole, side by side in the filter in the same order.
    for (std::size_t j = 0; j < N; ++j) ok = ok && in_f[xs[j]] >= FR;
    for (std::size_t i = P; i < R; ++i) ok = ok && in_f[i] < FR && in_f[i] == in_f[P] + (i - P) && x_mask[i] == 0;
    // Batch dims: x's other first dims, not the filter's, side by side.
    std::size_t first = R, last = 0, count = 0;
    for (std::size_t i = 0; i < P; ++i)
      if (!is_spatial(i)) {
        ok = ok && in_f[i] >= FR;
        first = std::min(first, i), last = i, ++count;
      }
    ok = ok && (count == 0 || last + 1 - first == count);
    // Channels out: the filter's own dims, side by side.
    std::size_t o_first = FR, o_last = 0, o_count = 0;
    for (std::size_t i = 0; i < FR; ++i)
      if (!in_x[i] && !is_window(i)) {
        o_first = std::min(o_first, i), o_last = i, ++o_count;
        l.out_axes |= f_mask[i];
      }
    ok = ok && (o_count == 0 || o_last + 1 - o_first == o_count);
    for (std::size_t i = 0; i < P; ++i) l.batch_spatial_axes |= x_mask[i];
    l.ok = ok;
    l.prefix = P;
    l.batch_first = count ? first : 0, l.batch_count = count;
    for (std::size_t j = 0; j < N; ++j) l.x_spatial[j] = xs[j], l.f_window[j] = fw[j];
    l.f_in_first = in_f[P];
    l.f_out_first = o_count ? o_first : 0, l.f_out_count = o_count;
  }
  return l;
}
template <Tensor X, Tensor F, class... S>
inline constexpr direct_conv_dims direct_conv_layout_v = direct_conv_layout_of<X, F, S...>();

// The direct convolution of this processor's slice: src is the halo buffer (extents b_ext, its
// first element at global b_begin), dst the result's slice, weights the filter's slice.
template <std::size_t R, std::size_t N>
kernels::conv_problem direct_conv_problem(const direct_conv_dims& l, const std::array<std::int64_t, R>& b_ext,
                                          const std::array<std::int64_t, R>& b_begin, const std::array<halo_dim, N>& halos,
                                          std::span<const std::int64_t> y_ext, std::span<const std::int64_t> y_off,
                                          std::span<const std::int64_t> f_ext) {
  const kidx sb = row_major_strides_of(b_ext), sy = row_major_strides_of(y_ext), sf = row_major_strides_of(f_ext);
  auto product = [](std::span<const std::int64_t> e, std::size_t from, std::size_t to) {
    std::int64_t p = 1;
    for (std::size_t i = from; i < to; ++i) p *= e[i];
    return p;
  };
  const std::size_t P = l.prefix, nb = l.batch_first, ne = l.batch_first + l.batch_count;
  kernels::conv_problem p;
  p.spatial = static_cast<int>(N);
  p.n = product(b_ext, nb, ne);
  p.ic = product(b_ext, P, R);
  p.oc = product(y_ext, P, y_ext.size());
  // A dim of extent 1 (or none) may have any stride: the whole slice's size keeps it dense.
  p.src_strides[0] = l.batch_count ? sb[ne - 1] : product(b_ext, 0, R);
  p.src_strides[1] = 1;
  p.dst_strides[0] = l.batch_count ? sy[ne - 1] : product(y_ext, 0, y_ext.size());
  p.dst_strides[1] = 1;
  p.weights_strides[0] = l.f_out_count ? sf[l.f_out_first + l.f_out_count - 1] : product(f_ext, 0, f_ext.size());
  p.weights_strides[1] = sf[l.f_in_first + (R - P) - 1];
  for (std::size_t j = 0; j < N; ++j) {
    const std::size_t d = l.x_spatial[j];
    const window_geometry& g = halos[j].geo;
    p.in[j] = b_ext[d], p.out[j] = y_ext[d], p.taps[j] = f_ext[l.f_window[j]];
    p.stride[j] = g.stride, p.dilation[j] = g.dilation;
    p.src_strides[2 + j] = sb[d], p.dst_strides[2 + j] = sy[d], p.weights_strides[2 + j] = sf[l.f_window[j]];
    // Output o reads global o * stride - pad_lo + k * dilation; the buffer starts at b_begin. A
    // buffer that starts before the first read, or ends after the last, is cut to the reads.
    std::int64_t lo = g.pad_lo + b_begin[d] - y_off[d] * g.stride;
    if (lo < 0) {
      p.src_offset += -lo * sb[d];
      p.in[j] += lo;
      lo = 0;
    }
    std::int64_t hi = (p.out[j] - 1) * g.stride + (p.taps[j] - 1) * g.dilation + 1 - p.in[j] - lo;
    if (hi < 0) {
      p.in[j] += hi;
      hi = 0;
    }
    p.pad_lo[j] = lo, p.pad_hi[j] = hi;
  }
  return p;
}

// Whether the problem covers the whole buffer (backward data then writes every element of it).
template <std::size_t R, std::size_t N>
bool covers_buffer(const kernels::conv_problem& p, const direct_conv_dims& l, const std::array<std::int64_t, R>& b_ext) {
  bool all = !p.empty() && p.src_offset == 0;
  for (std::size_t j = 0; j < N; ++j) all = all && p.in[j] == b_ext[l.x_spatial[j]];
  return all;
}

// The filter's window dims must have the windows' sizes (op names the caller in the error).
template <class... S, Tensor F>
void check_filter_windows(const char* op, const F& filter, const direct_conv_dims& l,
                          const std::array<window, sizeof...(S)>& windows) {
  constexpr std::array<std::string_view, sizeof...(S)> window_names{S::window_dim::name()...};
  for (std::size_t j = 0; j < sizeof...(S); ++j)
    if (filter.extents()[l.f_window[j]] != windows[j].size)
      throw shape_error(cat(op, ": the filter's window dim '", window_names[j], "' has extent ",
                            filter.extents()[l.f_window[j]], " but the window has size ", windows[j].size));
}

// The filter's gradient from the direct conv's input buffer (src, its halos in) and the gradient of
// its output (diff_dst): backward weights, a partial sum over the split axes of batch and spatial dims.
template <Tensor F>
void push_filter_grad(const F& filter, const kernels::conv_problem& p, const typename F::value_type* src,
                      const typename F::value_type* diff_dst, const direct_conv_dims& l) {
  F df(filter.mesh(), filter.extents(), uninitialized);
  kernels::convolution_backward_weights<typename F::execution_space, typename F::value_type>(p, src, diff_dst,
                                                                                            df.view().data());
  push_partial_grad(filter, std::move(df), l.batch_spatial_axes);
}

// conv as a direct convolution per processor, with unfold's halos; gradient: backward data onto the
// halo buffer, whose halos go back as fold's do (a partial sum over the split axes of channels
// out), and backward weights (a partial sum over the split axes of batch and spatial dims).
template <class... S, Tensor X, Tensor F>
auto conv_direct(const X& x, const F& filter, const std::array<window, sizeof...(S)>& windows) {
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  using mem = typename X::memory_space;
  using Y = with_dims_t<X, conv_dims_t<X, F, S...>>;
  constexpr std::size_t R = X::rank, N = sizeof...(S);
  constexpr direct_conv_dims l = direct_conv_layout_v<X, F, S...>;
  constexpr std::size_t P = l.prefix;
  const auto halos = schedule_halos<X, S...>("conv", x.mesh(), x.extents(), windows);
  check_filter_windows<S...>("conv", filter, l, windows);
  check_shared_extents("conv", x, filter);
  typename Y::extents_type y_ext{};
  for (std::size_t i = 0; i < P; ++i) y_ext[i] = x.extents()[i];
  for (std::size_t j = 0; j < N; ++j) y_ext[l.x_spatial[j]] = halos[j].geo.out;
  for (std::size_t c = 0; c < l.f_out_count; ++c) y_ext[P + c] = filter.extents()[l.f_out_first + c];
  Y out(x.mesh(), y_ext, uninitialized);
  halo_buffer<T, mem, R> b{x.view(), x.local_extents(), x.offsets()};
  for (const auto& h : halos) take_halo<Exec>(x.mesh().communicator(), b, h);
  const kernels::conv_problem p = direct_conv_problem<R, N>(l, b.ext, b.begin, halos, out.local_extents(), out.offsets(),
                                                            filter.local_extents());
  kernels::convolution_forward<Exec, T>(p, b.v.data(), filter.view().data(), out.view().data());
  record<Y>(
      out,
      [x, filter, b, halos, p, l](const Y& g) {
        if (x.tracks_grad()) {
          halo_buffer<T, mem, R> db{view_pool<T, mem>::get().allocate(b.v.extent(0)), b.ext, b.begin};
          if (!covers_buffer<R, N>(p, l, b.ext)) kernels::deep_copy(db.v, T(0));
          kernels::convolution_backward_data<Exec, T>(p, g.view().data(), filter.view().data(), db.v.data());
          for (std::size_t j = N; j-- > 0;) return_halo<Exec>(x.mesh().communicator(), db, halos[j]);
          push_partial_grad(x, X(x.mesh(), x.extents(), db.v), l.out_axes);
        }
        if (filter.tracks_grad()) push_filter_grad(filter, p, b.v.data(), g.view().data(), l);
      },
      x, filter);
  return out;
}

// Whether conv_transpose<S...>(y, filter) can run as the direct conv's backward data: the conv from
// its result X to Y is direct-eligible, has Y's dims in Y's order, and leaves channels out (the
// dims it contracts) unsplit, so that no sum crosses processors and the collectives are fold's.
template <Tensor Y, Tensor F, class... S>
constexpr bool direct_transpose_ok() {
  using X = transpose_input_t<Y, F, S...>;
  constexpr direct_conv_dims l = direct_conv_layout_v<X, F, S...>;
  return l.ok && l.out_axes == 0 && std::is_same_v<typename Y::dims, conv_dims_t<X, F, S...>>;
}

// conv_transpose as the direct conv's backward data per processor: y's slice to a buffer of the
// result's slice with its halos, whose halos go back to their owners as fold's do (return_halo).
// Gradient: to y, the direct forward conv of the gradient's slice with its halos (take_halo, as
// unfold of the gradient); to the filter, backward weights (a partial sum over the split axes of
// batch and spatial dims, as einsum's).
template <class... S, Tensor Y, Tensor F>
auto conv_transpose_direct(const Y& y, const F& filter, const std::array<std::int64_t, sizeof...(S)>& spatial_extents,
                           const std::array<window, sizeof...(S)>& windows) {
  using T = typename Y::value_type;
  using Exec = typename Y::execution_space;
  using mem = typename Y::memory_space;
  using X = transpose_input_t<Y, F, S...>;
  constexpr std::size_t R = X::rank, N = sizeof...(S);
  constexpr direct_conv_dims l = direct_conv_layout_v<X, F, S...>;
  constexpr std::size_t P = l.prefix;
  constexpr std::array<std::string_view, N> names{S::dim::name()...};
  typename X::extents_type x_ext{};
  for (std::size_t i = 0; i < P; ++i) x_ext[i] = y.extents()[i];
  for (std::size_t j = 0; j < N; ++j) x_ext[l.x_spatial[j]] = spatial_extents[j];
  for (std::size_t c = P; c < R; ++c) x_ext[c] = filter.extents()[l.f_in_first + (c - P)];
  const auto halos = schedule_halos<X, S...>("conv_transpose", y.mesh(), x_ext, windows);
  check_filter_windows<S...>("conv_transpose", filter, l, windows);
  for (std::size_t j = 0; j < N; ++j) {
    if (y.extents()[l.x_spatial[j]] != halos[j].geo.out)
      throw shape_error(cat("conv_transpose: dim '", names[j], "' of extent ", spatial_extents[j], " has ",
                            halos[j].geo.out, " window positions, but y has ", y.extents()[l.x_spatial[j]]));
  }
  check_shared_extents("conv_transpose", y, filter);
  X out(y.mesh(), x_ext, uninitialized);
  // The buffer the forward conv would read: the result's slice with its halos.
  auto db = halo_buffer_for<T, mem>(out.local_extents(), out.offsets(), halos);
  const kernels::conv_problem p = direct_conv_problem<R, N>(l, db.ext, db.begin, halos, y.local_extents(), y.offsets(),
                                                            filter.local_extents());
  if (!covers_buffer<R, N>(p, l, db.ext)) kernels::deep_copy(db.v, T(0));
  kernels::convolution_backward_data<Exec, T>(p, y.view().data(), filter.view().data(), db.v.data());
  for (std::size_t j = N; j-- > 0;) return_halo<Exec>(y.mesh().communicator(), db, halos[j]);
  out = X(y.mesh(), x_ext, db.v);
  record<X>(
      out,
      [y, filter, halos, p, l](const X& g) {
        halo_buffer<T, mem, R> gb{g.view(), g.local_extents(), g.offsets()};
        for (const auto& h : halos) take_halo<Exec>(g.mesh().communicator(), gb, h);
        if (y.tracks_grad()) {
          Y dy(y.mesh(), y.extents(), uninitialized);
          kernels::convolution_forward<Exec, T>(p, gb.v.data(), filter.view().data(), dy.view().data());
          push_fresh_grad(y, std::move(dy));
        }
        if (filter.tracks_grad()) push_filter_grad(filter, p, gb.v.data(), y.view().data(), l);
      },
      y, filter);
  return out;
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <class... S, Tensor X, Tensor F>
  requires(sizeof...(S) > 0)
auto conv(const X& x, const F& filter, meshtensor::window_for<S>... windows) {
  static_assert((contains_v<typename S::window_dim, typename F::dims> && ...),
                "meshtensor::nn::conv: the filter needs every window dim (its taps along each spatial dim)");
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"conv"});
  if constexpr (meshtensor::detail::direct_conv_layout_v<X, F, S...>.ok) {
    static_assert((meshtensor::detail::spatial_checked_v<X, S> && ...));
    if (kernels::has_convolution<typename X::execution_space, typename X::value_type>())
      return meshtensor::detail::conv_direct<S...>(x, filter, {windows...});
  }
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
                    meshtensor::window_for<S>... windows) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"conv_transpose"});
  if constexpr (meshtensor::detail::direct_transpose_ok<Y, F, S...>()) {
    static_assert((meshtensor::detail::spatial_checked_v<meshtensor::detail::transpose_input_t<Y, F, S...>, S> && ...));
    if (kernels::has_convolution<typename Y::execution_space, typename Y::value_type>())
      return meshtensor::detail::conv_transpose_direct<S...>(y, filter, spatial_extents, {windows...});
  }
  return fold<S...>(meshtensor::detail::einsum_to(meshtensor::detail::transpose_cols_dims_t<Y, F, S...>{}, y, filter), spatial_extents,
                    windows...);
}

template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto max_pool(const X& x, meshtensor::window_for<S>... windows) {
  using T = typename X::value_type;
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"max_pool"});
  return reduce_max<typename S::window_dim...>(unfold<S...>(x, -std::numeric_limits<T>::infinity(), windows...));
}

template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto avg_pool(const X& x, meshtensor::window_for<S>... windows) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"avg_pool"});
  return reduce_mean<typename S::window_dim...>(unfold<S...>(x, windows...));
}

// Training-mode batch normalisation: statistics of this batch over Ds (biased variance).
template <Dim... Ds, Tensor X, Tensor P>
X batch_norm(const X& x, const P& scale, const P& bias, typename X::value_type eps = 1e-5) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"batch_norm"});
  return normalize<Ds...>(x, eps) * scale + bias;
}

}  // namespace meshtensor::nn
