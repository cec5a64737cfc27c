#pragma once
// unfold<spatial<D, K>...>(x, window...): the sliding windows of a kernel over the spatial dims D,
// each window's taps along a new dim K (im2col, by name). fold<spatial<D, K>...>(cols, extents,
// window...) is its adjoint: every tap added back onto the element it was read from (col2im). A
// convolution is unfold followed by einsum, a pool unfold followed by a reduction (nn/conv.hpp).
// Communication, per spatial dim D in order (halos of later dims then carry the corners):
//  - D not split: none.
//  - D split over one axis, and no window reaching past a neighbour's part: two `shift`s along
//    that axis, one per side, each of exactly the elements the neighbour's windows read (its
//    halo: a function of kernel size, stride, dilation, padding and the uneven parts).
//  - Otherwise (D split over several axes, or a halo wider than a neighbour's part): one
//    allgather of D over its axes. Correct, and visible in the plan (unfold_plan vs
//    unfold_gather_plan).
// fold and unfold's gradient send the same halos back and add them where they came from (an
// allreduce where unfold allgathered).
// The spatial-dim types and halo schedule are ops/spatial.hpp; the halo transport, shared with the
// direct convolutions, ops/halo.hpp.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <utility>

#include "../geometry/window.hpp"
#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "halo.hpp"
#include "spatial.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {
namespace detail {

// Where each dim of the input sits among the spatial dims (-1: not spatial), and per spatial dim
// the geometry the kernels need, as device-copyable arrays.
template <std::size_t R, std::size_t N>
struct window_maps {
  Kokkos::Array<int, R> spatial_of;
  Kokkos::Array<std::int64_t, N> stride, dilation, pad_lo, extent;
  explicit window_maps(const std::array<halo_dim, N>& halos) {
    for (std::size_t d = 0; d < R; ++d) spatial_of[d] = -1;
    for (std::size_t j = 0; j < N; ++j) {
      spatial_of[halos[j].index] = static_cast<int>(j);
      stride[j] = halos[j].geo.stride;
      dilation[j] = halos[j].geo.dilation;
      pad_lo[j] = halos[j].geo.pad_lo;
      extent[j] = halos[j].geo.extent;
    }
  }
};

// Number of input dims up to and including the last spatial one.
template <std::size_t N>
std::size_t prefix_of(const std::array<halo_dim, N>& halos) {
  std::size_t p = 0;
  for (const auto& h : halos) p = std::max(p, h.index + 1);
  return p;
}

template <std::size_t R, class A>
Kokkos::Array<std::int64_t, R> device_array(const A& a) {
  Kokkos::Array<std::int64_t, R> r;
  for (std::size_t i = 0; i < R; ++i) r[i] = a[i];
  return r;
}

// The kernels depend on (space, element type, ranks) only, not on the tensor types: one instance
// serves every layout (docs/design/ops.md, "Ops and communication"). Dims [0, P) of x hold the
// spatial dims; dims [P, R) follow them (channels, usually) and are copied as contiguous runs of
// `inner`.
// unfold: out[a..., k..., t...] = buffer[a at o * stride - pad_lo + k * dilation, t...], else fill.
template <class Exec, class T, std::size_t R, std::size_t N>
void unfold_kernel(const halo_buffer<T, typename Exec::memory_space, R>& b, const window_maps<R, N>& m, std::size_t P,
                   const Kokkos::View<T*, typename Exec::memory_space>& ov, const std::array<std::int64_t, R + N>& out_ext,
                   const std::array<std::int64_t, R + N>& out_off, T fill) {
  constexpr std::size_t RO = R + N;
  const auto oe = device_array<RO>(out_ext), oo = device_array<RO>(out_off);
  const auto be = device_array<R>(b.ext), bb = device_array<R>(b.begin);
  std::int64_t runs = 1, inner = 1;
  for (std::size_t d = 0; d < P + N; ++d) runs *= out_ext[d];
  for (std::size_t d = P + N; d < RO; ++d) inner *= out_ext[d];
  const auto bv = b.v;
  kernels::parallel_for(
      "meshtensor::unfold", kernels::range<Exec>(0, runs), KOKKOS_LAMBDA(std::int64_t run) {
        Kokkos::Array<std::int64_t, RO> at;
        std::int64_t rest = run;
        for (std::size_t d = P + N; d-- > 0;) {
          at[d] = rest % oe[d];
          rest /= oe[d];
        }
        std::int64_t src = 0;
        bool inside = true;
        for (std::size_t d = 0; d < P; ++d) {
          std::int64_t l = at[d];
          const int j = m.spatial_of[d];
          if (j >= 0) {
            const std::int64_t g = (oo[d] + at[d]) * m.stride[j] - m.pad_lo[j] + at[P + j] * m.dilation[j];
            inside = inside && g >= 0 && g < m.extent[j];
            l = g - bb[d];
          }
          src = src * be[d] + l;
        }
        T* dst = &ov(run * inner);
        if (inside) {
          const T* from = &bv(src * inner);
          for (std::int64_t i = 0; i < inner; ++i) dst[i] = from[i];
        } else {
          for (std::int64_t i = 0; i < inner; ++i) dst[i] = fill;
        }
      });
}

// fold: each buffer run the sum of the tap runs that read it (no two work items write one run).
template <class Exec, class T, std::size_t R, std::size_t N>
void fold_kernel(const Kokkos::View<T*, typename Exec::memory_space>& cv, const std::array<std::int64_t, R + N>& cols_ext,
                 const std::array<std::int64_t, R + N>& cols_off, const window_maps<R, N>& m, std::size_t P,
                 const halo_buffer<T, typename Exec::memory_space, R>& b) {
  constexpr std::size_t RO = R + N;
  const auto ce = device_array<RO>(cols_ext), co = device_array<RO>(cols_off);
  const auto be = device_array<R>(b.ext), bb = device_array<R>(b.begin);
  std::int64_t runs = 1, inner = 1, taps = 1;
  for (std::size_t d = 0; d < P; ++d) runs *= b.ext[d];
  for (std::size_t d = P; d < R; ++d) inner *= b.ext[d];
  for (std::size_t j = 0; j < N; ++j) taps *= cols_ext[P + j];
  const auto bv = b.v;
  kernels::parallel_for(
      "meshtensor::fold", kernels::range<Exec>(0, runs), KOKKOS_LAMBDA(std::int64_t run) {
        Kokkos::Array<std::int64_t, R> at;
        std::int64_t rest = run;
        for (std::size_t d = P; d-- > 0;) {
          at[d] = rest % be[d];
          rest /= be[d];
        }
        T* dst = &bv(run * inner);
        for (std::int64_t i = 0; i < inner; ++i) dst[i] = T(0);
        Kokkos::Array<std::int64_t, N> k;  // tap t's index per window dim, stepped like an odometer
        for (std::size_t j = 0; j < N; ++j) k[j] = 0;
        for (std::int64_t t = 0; t < taps; ++t) {
          if (t > 0)
            for (std::size_t j = N; j-- > 0;) {
              if (++k[j] < ce[P + j]) break;
              k[j] = 0;
            }
          std::int64_t src = 0;
          bool hit = true;
          for (std::size_t d = 0; d < P && hit; ++d) {
            std::int64_t l = at[d];
            const int j = m.spatial_of[d];
            if (j >= 0) {
              // The output position whose tap k reads here: s / stride, when stride divides s (no
              // division at stride 1, the common case: divisions dominated this kernel).
              const std::int64_t s = bb[d] + at[d] + m.pad_lo[j] - k[j] * m.dilation[j];
              const std::int64_t q = m.stride[j] == 1 ? s : s / m.stride[j];
              hit = s >= 0 && (m.stride[j] == 1 || s % m.stride[j] == 0) && q >= co[d] && q < co[d] + ce[d];
              l = q - co[d];
            }
            src = src * ce[d] + l;
          }
          if (hit) {
            const T* from = &cv((src * taps + t) * inner);
            for (std::int64_t i = 0; i < inner; ++i) dst[i] += from[i];
          }
        }
      });
}

// unfold without recording: the halos in, then every output element read from the buffer.
template <Tensor Out, Tensor X>
Out unfold_local(const X& x, const std::array<halo_dim, Out::rank - X::rank>& halos, typename X::value_type fill) {
  const collective_subject subject(&X::type_name);
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  constexpr std::size_t R = X::rank, N = Out::rank - X::rank;
  const std::size_t P = prefix_of(halos);
  typename Out::extents_type oext{};
  for (std::size_t d = 0; d < R; ++d) oext[d < P ? d : d + N] = x.extents()[d];
  for (std::size_t j = 0; j < N; ++j) {
    oext[halos[j].index] = halos[j].geo.out;
    oext[P + j] = halos[j].geo.size;
  }
  Out out(x.mesh(), oext, uninitialized);
  halo_buffer<T, typename X::memory_space, R> b{x.view(), x.local_extents(), x.offsets()};
  for (const auto& h : halos) take_halo<Exec>(x.mesh().communicator(), b, h);
  unfold_kernel<Exec>(b, window_maps<R, N>(halos), prefix_of(halos), out.view(), out.local_extents(), out.offsets(), fill);
  return out;
}

// fold without recording: every tap added onto the buffer element it reads, then the halos back.
template <Tensor X, Tensor Cols>
X fold_local(const Cols& cols, const typename X::extents_type& extents, const std::array<halo_dim, Cols::rank - X::rank>& halos) {
  const collective_subject subject(&Cols::type_name);
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  constexpr std::size_t R = X::rank, N = Cols::rank - X::rank;
  // The result's slice: cols' along the other dims, this processor's part along the spatial ones.
  const std::size_t P = prefix_of(halos);
  std::array<std::int64_t, R> ext{}, begin{};
  for (std::size_t d = 0; d < R; ++d) {
    ext[d] = cols.local_extents()[d < P ? d : d + N];
    begin[d] = cols.offsets()[d < P ? d : d + N];
  }
  auto b = halo_buffer_for<T, typename X::memory_space>(ext, begin, halos);
  fold_kernel<Exec>(cols.view(), cols.local_extents(), cols.offsets(), window_maps<R, N>(halos), P, b);
  for (std::size_t j = N; j-- > 0;) return_halo<Exec>(cols.mesh().communicator(), b, halos[j]);
  return X(cols.mesh(), extents, b.v);
}

}  // namespace detail

// ---- plans ------------------------------------------------------------------------------------
// unfold when every halo comes from the neighbours: per spatial dim in order, two shifts when it is
// split over one axis, one allgather when over several, nothing when not split.
template <Tensor X, class... S>
constexpr comm_plan unfold_plan() {
  comm_plan p{};
  for (const auto s : {X::layout_type::template split_of<typename S::dim>()...}) {
    if (s.count == 1) p.then(collective::shift, s.mask()).then(collective::shift, s.mask());
    if (s.count > 1) p.then(collective::allgather, s.mask());
  }
  return p;
}
// unfold when a halo is wider than a neighbour's part: one allgather per split spatial dim.
template <Tensor X, class... S>
constexpr comm_plan unfold_gather_plan() {
  comm_plan p{};
  for (const auto s : {X::layout_type::template split_of<typename S::dim>()...})
    if (s.count > 0) p.then(collective::allgather, s.mask());
  return p;
}
// fold (and unfold's gradient), per spatial dim in reverse order: two shifts, or one allreduce
// where unfold allgathers.
template <Tensor X, class... S>
constexpr comm_plan fold_plan() {
  comm_plan p{};
  constexpr std::array<dim_split, sizeof...(S)> splits{X::layout_type::template split_of<typename S::dim>()...};
  for (std::size_t j = splits.size(); j-- > 0;) {
    if (splits[j].count == 1) p.then(collective::shift, splits[j].mask()).then(collective::shift, splits[j].mask());
    if (splits[j].count > 1) p.then(collective::allreduce, splits[j].mask());
  }
  return p;
}
template <Tensor X, class... S>
constexpr comm_plan fold_gather_plan() {
  comm_plan p{};
  constexpr std::array<dim_split, sizeof...(S)> splits{X::layout_type::template split_of<typename S::dim>()...};
  for (std::size_t j = splits.size(); j-- > 0;)
    if (splits[j].count > 0) p.then(collective::allreduce, splits[j].mask());
  return p;
}

// unfold's and fold's step: the halo schedule, and the collectives it runs, per spatial dim (unfold
// in order, fold in reverse): two shifts on the neighbours path, one allgather (fold: allreduce) on
// the gather path, nothing where the dim is not split. unfold_plan and unfold_gather_plan (fold_*)
// are the two uniform cases of it.
namespace detail {
template <std::size_t N>
struct halo_op {
  const char* name;
  std::array<halo_dim, N> halos;
  bool folds = false;
  comm_plan plan() const {
    comm_plan p{};
    for (std::size_t k = 0; k < N; ++k) {
      const auto& h = halos[folds ? N - 1 - k : k];
      if (h.path == halo_path::neighbours)
        p.then(collective::shift, h.split.mask()).then(collective::shift, h.split.mask());
      if (h.path == halo_path::gather) p.then(folds ? collective::allreduce : collective::allgather, h.split.mask());
    }
    return p;
  }
};
}  // namespace detail

// ---- ops --------------------------------------------------------------------------------------
// x's windows: x's dims (each spatial dim with its number of window positions), then one window dim
// per spatial dim holding the taps. Taps outside the extent (padding same) read `fill`.
// Gradient: fold of the gradient.
// (The result type is deduced, so that a wrong spatial<D, K> stops at check_spatial's message.)
template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto unfold(const X& x, typename X::value_type fill, window_for<S>... windows) {
  static_assert((detail::spatial_checked_v<X, S> && ...));
  using Out = detail::unfolded_t<X, S...>;
  const detail::op_call call(detail::halo_op<sizeof...(S)>{"unfold", detail::schedule_halos<X, S...>("unfold", x.mesh(), x.extents(), {windows...})}, x);
  const auto& halos = call.op().halos;
  Out out = detail::unfold_local<Out>(x, halos, fill);
  detail::record<Out>(
      out, [x = detail::node_only(x), halos](const Out& g) { detail::push_grad(x, detail::fold_local<X>(g, x.extents(), halos)); }, x);
  return out;
}
template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto unfold(const X& x, window_for<S>... windows) {
  return unfold<S...>(x, typename X::value_type(0), windows...);
}

// The adjoint of unfold: cols (in unfold's order: an input's dims up to its last spatial dim, the
// window dims, the input's other dims) added back onto an input of the given spatial extents (one
// per spatial dim, in order); the other dims keep cols' extents. Gradient: unfold of the gradient.
template <class... S, Tensor Cols>
  requires(sizeof...(S) > 0)
detail::folded_t<Cols, S...> fold(const Cols& cols, const std::array<std::int64_t, sizeof...(S)>& spatial_extents,
                                  window_for<S>... windows) {
  using X = detail::folded_t<Cols, S...>;
  static_assert((detail::spatial_checked_v<X, S> && ...));
  static_assert(std::is_same_v<typename Cols::dims, detail::unfolded_dims_t<X, S...>>,
                "meshtensor: fold's columns must have unfold's dim order: the input's dims up to its last spatial "
                "dim, then the window dims, then the input's other dims");
  constexpr std::size_t P = detail::spatial_prefix_v<X, S...>, N = sizeof...(S);
  typename X::extents_type ext{};
  for (std::size_t d = 0; d < X::rank; ++d) ext[d] = cols.extents()[d < P ? d : d + N];
  constexpr std::array<std::size_t, N> index{X::template index_of<typename S::dim>()...};
  constexpr std::array<std::string_view, N> names{S::dim::name()...};
  const std::array<window, N> ws{windows...};
  for (std::size_t j = 0; j < N; ++j) ext[index[j]] = spatial_extents[j];
  const detail::op_call call(detail::halo_op<N>{"fold", detail::schedule_halos<X, S...>("fold", cols.mesh(), ext, ws), true}, cols);
  const auto& halos = call.op().halos;
  for (std::size_t j = 0; j < N; ++j)
    if (cols.extents()[index[j]] != halos[j].geo.out || cols.extents()[P + j] != ws[j].size)
      throw shape_error(detail::cat("fold: dim '", names[j], "' of extent ", spatial_extents[j], " has ", halos[j].geo.out,
                                    " window positions of ", ws[j].size, " taps, but the columns have ",
                                    cols.extents()[index[j]], " positions and ", cols.extents()[P + j], " taps"));
  X out = detail::fold_local<X>(cols, ext, halos);
  detail::record<X>(
      out,
      [cols, halos](const X& g) {
        detail::push_grad(cols, detail::unfold_local<Cols>(g, halos, typename X::value_type(0)));
      },
      cols);
  return out;
}

}  // namespace meshtensor
