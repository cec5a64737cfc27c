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
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

// Spatial dim D of the input, and K: the dim of a window's taps in unfold's result.
template <Dim D, Dim K>
struct spatial {
  using dim = D;
  using window_dim = K;
};

namespace diagnostic {
template <class D>
struct unfold_spatial_dim_not_in_input {
  static_assert(sizeof(D) == 0, "meshtensor: unfold/fold: a spatial dim is not a dim of the input");
};
template <class K>
struct unfold_window_dim_already_in_input {
  static_assert(sizeof(K) == 0, "meshtensor: unfold: a window dim is already a dim of the input");
};
template <class K>
struct unfold_window_dim_split {
  static_assert(sizeof(K) == 0,
                "meshtensor: unfold/fold: a window dim is split by the layout; windows are a few taps: keep "
                "the window dim whole");
};
}  // namespace diagnostic

namespace detail {

template <class>
using window_for = window;

template <class S>
struct is_spatial : std::false_type {};
template <class D, class K>
struct is_spatial<spatial<D, K>> : std::true_type {};

// unfold's result: x's dims up to its last spatial dim, the window dims, then x's other dims (so
// that with channels last, each tap is a contiguous run of channels and conv's product is one
// GEMM with no permutation). fold's result: the columns without the window dims.
template <class List, std::size_t From, class Seq>
struct pick_list;
template <class... Ts, std::size_t From, std::size_t... I>
struct pick_list<type_list<Ts...>, From, std::index_sequence<I...>> {
  using type = type_list<std::tuple_element_t<From + I, std::tuple<Ts...>>...>;
};
template <class A, class B, class C>
struct join3_lists;
template <class... A, class... B, class... C>
struct join3_lists<type_list<A...>, type_list<B...>, type_list<C...>> {
  using type = type_list<A..., B..., C...>;
};
// Number of x's dims up to and including its last spatial dim.
template <Tensor X, class... S>
inline constexpr std::size_t spatial_prefix_v = std::max({X::template index_of<typename S::dim>()...}) + 1;
template <Tensor X, class... S>
using unfolded_dims_t = typename join3_lists<
    typename pick_list<typename X::dims, 0, std::make_index_sequence<spatial_prefix_v<X, S...>>>::type,
    type_list<typename S::window_dim...>,
    typename pick_list<typename X::dims, spatial_prefix_v<X, S...>,
                       std::make_index_sequence<X::rank - spatial_prefix_v<X, S...>>>::type>::type;
template <Tensor X, class... S>
using unfolded_t = with_dims_t<X, unfolded_dims_t<X, S...>>;
template <Tensor Cols, class... S>
using folded_t = with_dims_t<Cols, difference_t<typename Cols::dims, type_list<typename S::window_dim...>>>;

template <Tensor X, class S>
constexpr bool check_spatial() {
  static_assert(is_spatial<S>::value, "meshtensor: unfold/fold take spatial<D, K> pairs: spatial dim, window dim");
  if constexpr (!contains_v<typename S::dim, typename X::dims>)
    (void)diagnostic::unfold_spatial_dim_not_in_input<typename S::dim>{};
  else if constexpr (contains_v<typename S::window_dim, typename X::dims>)
    (void)diagnostic::unfold_window_dim_already_in_input<typename S::window_dim>{};
  else if constexpr (X::layout_type::template split_of<typename S::window_dim>().count != 0)
    (void)diagnostic::unfold_window_dim_split<typename S::window_dim>{};
  return true;
}
// A constant, so that the check runs where it is named (a function body's instantiation may be
// deferred, and another error would come first).
template <Tensor X, class S>
inline constexpr bool spatial_checked_v = check_spatial<X, S>();

// The halo schedule of every spatial dim of an input with these extents under X's layout
// (geometry/window.hpp's schedule_halo, per dim).
template <Tensor X, class... S>
std::array<halo_dim, sizeof...(S)> schedule_halos(const char* op, const typename X::mesh_type& mesh,
                                                  const typename X::extents_type& extents,
                                                  const std::array<window, sizeof...(S)>& windows) {
  constexpr std::array<std::size_t, sizeof...(S)> index{X::template index_of<typename S::dim>()...};
  constexpr std::array<dim_split, sizeof...(S)> splits{X::layout_type::template split_of<typename S::dim>()...};
  constexpr std::array<std::string_view, sizeof...(S)> names{S::dim::name()...};
  std::array<halo_dim, sizeof...(S)> halos{};
  const auto& comm = mesh.communicator();
  for (std::size_t j = 0; j < sizeof...(S); ++j)
    halos[j] = schedule_halo(index[j], splits[j], geometry_of(op, names[j], extents[index[j]], windows[j]), comm.shape(),
                             comm.coords());
  return halos;
}

// An input's local data with halos: row-major over ext, element l along dim d at global begin[d] + l.
template <class T, class Mem, std::size_t R>
struct halo_buffer {
  Kokkos::View<T*, Mem> v;
  std::array<std::int64_t, R> ext{}, begin{};
};

// A buffer, from the pool and not filled, shaped as the one take_halo leaves once every halo of `halos`
// is in: a slice's extents and offsets (ext, begin) along the other dims; along each spatial dim
// this processor's part, widened to the range its windows read where halos are exchanged. What
// fold and conv_transpose's direct path add into before return_halo.
template <class T, class Mem, std::size_t R, std::size_t N>
halo_buffer<T, Mem, R> halo_buffer_for(const std::array<std::int64_t, R>& ext, const std::array<std::int64_t, R>& begin,
                                       const std::array<halo_dim, N>& halos) {
  halo_buffer<T, Mem, R> b{{}, ext, begin};
  for (const auto& h : halos) {
    b.ext[h.index] = h.path == halo_path::local ? h.own_hi - h.own_lo : h.buf_hi - h.buf_lo;
    b.begin[h.index] = h.path == halo_path::local ? h.own_lo : h.buf_lo;
  }
  std::int64_t n = 1;
  for (auto e : b.ext) n *= e;
  b.v = view_pool<T, Mem>::get().allocate(static_cast<std::size_t>(n));
  return b;
}

// b's data seen as [outer, n, inner] around its dim d.
template <class T, class Mem, std::size_t R>
along_view<Kokkos::View<T*, Mem>> along_dim(const halo_buffer<T, Mem, R>& b, std::size_t d) {
  const auto around = outer_inner<R>(b.ext, d);
  return {b.v, around.first, b.ext[d], around.second, b.begin[d]};
}

// Brings dim h's halo into b (forward: unfold). The kernels run over (outer, position) pairs and
// copy `inner` contiguous elements each.
template <class Exec, class T, std::size_t R>
void take_halo(communicator& comm, halo_buffer<T, typename Exec::memory_space, R>& b, const halo_dim& h) {
  using View = Kokkos::View<T*, typename Exec::memory_space>;
  if (h.path == halo_path::local) return;
  // Plain copies: a device lambda captures no structured binding under nvcc.
  const along_view<View> cur = along_dim(b, h.index);
  const std::int64_t outer = cur.outer, inner = cur.inner;
  if (h.path == halo_path::gather) {
    b.v = allgather_along<Exec>(comm, h.split, b.v, outer, cur.n, inner, h.geo.extent);
  } else {
    using buffer = mpi_buffer<Exec, T>;
    const int axis = h.split.axes[0];
    const auto right = buffer::reading(pack_along<Exec>(cur, h.to_right_at - h.own_lo, h.to_right));
    const auto left = buffer::reading(pack_along<Exec>(cur, h.to_left_at - h.own_lo, h.to_left));
    const auto got_left = buffer::writing(static_cast<std::size_t>(outer * h.from_left * inner));
    const auto got_right = buffer::writing(static_cast<std::size_t>(outer * h.from_right * inner));
    shift_v(comm, axis, right.data(), outer * h.to_right * inner, got_left.data(), outer * h.from_left * inner, 1);
    shift_v(comm, axis, left.data(), outer * h.to_left * inner, got_right.data(), outer * h.from_right * inner, -1);
    if (h.from_left + h.from_right > 0) {
      const View lv = got_left.view(), rv = got_right.view();
      const std::int64_t n = h.buf_hi - h.buf_lo, lo = h.buf_lo, own_lo = h.own_lo, own_hi = h.own_hi;
      const std::int64_t nl = h.from_left, nr = h.from_right, right_lo = std::max(lo, own_hi);
      View next = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(outer * n * inner));
      kernels::parallel_for(
          "meshtensor::unfold_halo", Kokkos::RangePolicy<Exec>(0, outer * n), KOKKOS_LAMBDA(std::int64_t ol) {
            const std::int64_t o = ol / n, g = lo + ol % n;
            const T* from = g < own_lo   ? &lv((o * nl + g - lo) * inner)
                            : g < own_hi ? &cur.v(cur.at(o, g - own_lo, 0))
                                         : &rv((o * nr + g - right_lo) * inner);
            T* to = &next(ol * inner);
            for (std::int64_t i = 0; i < inner; ++i) to[i] = from[i];
          });
      b.v = next;
    }
  }
  b.ext[h.index] = h.buf_hi - h.buf_lo;
  b.begin[h.index] = h.buf_lo;
}

// Sends dim h's halo back to where it came from and adds it there (the adjoint of take_halo).
template <class Exec, class T, std::size_t R>
void return_halo(communicator& comm, halo_buffer<T, typename Exec::memory_space, R>& b, const halo_dim& h) {
  using View = Kokkos::View<T*, typename Exec::memory_space>;
  if (h.path == halo_path::local) return;
  // Plain copies: a device lambda captures no structured binding under nvcc.
  const along_view<View> cur = along_dim(b, h.index);
  const std::int64_t outer = cur.outer, inner = cur.inner;
  const std::int64_t n = h.own_hi - h.own_lo, own_lo = h.own_lo, cur_lo = cur.begin, cur_n = cur.n;
  using buffer = mpi_buffer<Exec, T>;
  if (h.path == halo_path::gather) {
    // Every processor of D's axes holds the whole of D: their sums, then this processor's part.
    const auto sum = buffer::reading(b.v);
    allreduce(comm, h.split.mask(), sum.data(), outer * cur_n * inner);
    const View s = sum.view();
    View next = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(outer * n * inner));
    kernels::parallel_for(
        "meshtensor::fold_own", Kokkos::RangePolicy<Exec>(0, outer * n), KOKKOS_LAMBDA(std::int64_t ol) {
          const std::int64_t o = ol / n, l = ol % n;
          const T* from = &s((o * cur_n + own_lo + l) * inner);
          T* to = &next(ol * inner);
          for (std::int64_t i = 0; i < inner; ++i) to[i] = from[i];
        });
    b.v = next;
  } else {
    const int axis = h.split.axes[0];
    const auto left = buffer::reading(pack_along<Exec>(cur, 0, h.from_left));
    const auto right = buffer::reading(pack_along<Exec>(cur, std::max(h.need_lo, h.own_hi) - cur_lo, h.from_right));
    const auto back_from_right = buffer::writing(static_cast<std::size_t>(outer * h.to_right * inner));
    const auto back_from_left = buffer::writing(static_cast<std::size_t>(outer * h.to_left * inner));
    shift_v(comm, axis, left.data(), outer * h.from_left * inner, back_from_right.data(), outer * h.to_right * inner, -1);
    shift_v(comm, axis, right.data(), outer * h.from_right * inner, back_from_left.data(), outer * h.to_left * inner, 1);
    const View rv = back_from_right.view(), lv = back_from_left.view();
    const std::int64_t r_at = h.to_right_at - own_lo, r_n = h.to_right, l_at = h.to_left_at - own_lo, l_n = h.to_left;
    // The own part: the buffer itself when it holds no halo (added to in place), else a copy of it.
    View next = b.v;
    if (h.from_left + h.from_right > 0) {
      next = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(outer * n * inner));
      kernels::parallel_for(
          "meshtensor::fold_own", Kokkos::RangePolicy<Exec>(0, outer * n), KOKKOS_LAMBDA(std::int64_t ol) {
            // Own positions that no window here read lie outside the buffer: zeros.
            const std::int64_t o = ol / n, c = own_lo + ol % n - cur_lo;
            T* to = &next(ol * inner);
            if (c >= 0 && c < cur_n) {
              const T* from = &cur.v(cur.at(o, c, 0));
              for (std::int64_t i = 0; i < inner; ++i) to[i] = from[i];
            } else {
              for (std::int64_t i = 0; i < inner; ++i) to[i] = T(0);
            }
          });
    }
    // What the neighbours read here comes back and is added (two ranges of positions).
    if (r_n + l_n > 0) kernels::parallel_for(
        "meshtensor::fold_halo", Kokkos::RangePolicy<Exec>(0, outer * (r_n + l_n)), KOKKOS_LAMBDA(std::int64_t ol) {
          const std::int64_t o = ol / (r_n + l_n), q = ol % (r_n + l_n);
          const bool from_right = q < r_n;
          const std::int64_t l = from_right ? r_at + q : l_at + q - r_n;
          const T* from = from_right ? &rv((o * r_n + q) * inner) : &lv((o * l_n + q - r_n) * inner);
          T* to = &next((o * n + l) * inner);
          for (std::int64_t i = 0; i < inner; ++i) to[i] += from[i];
        });
    b.v = next;
  }
  b.ext[h.index] = n;
  b.begin[h.index] = own_lo;
}

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
// serves every layout (docs/design.md, "Ops and communication"). Dims [0, P) of x hold the spatial
// dims; dims [P, R) follow them (channels, usually) and are copied as contiguous runs of `inner`.
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
      "meshtensor::unfold", Kokkos::RangePolicy<Exec>(0, runs), KOKKOS_LAMBDA(std::int64_t run) {
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
      "meshtensor::fold", Kokkos::RangePolicy<Exec>(0, runs), KOKKOS_LAMBDA(std::int64_t run) {
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
struct halo_step {
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
auto unfold(const X& x, typename X::value_type fill, detail::window_for<S>... windows) {
  static_assert((detail::spatial_checked_v<X, S> && ...));
  using Out = detail::unfolded_t<X, S...>;
  const detail::op_call call(detail::halo_step<sizeof...(S)>{"unfold", detail::schedule_halos<X, S...>("unfold", x.mesh(), x.extents(), {windows...})}, x);
  const auto& halos = call.step().halos;
  Out out = detail::unfold_local<Out>(x, halos, fill);
  detail::record<Out>(
      out, [x = detail::node_only(x), halos](const Out& g) { detail::push_grad(x, detail::fold_local<X>(g, x.extents(), halos)); }, x);
  return out;
}
template <class... S, Tensor X>
  requires(sizeof...(S) > 0)
auto unfold(const X& x, detail::window_for<S>... windows) {
  return unfold<S...>(x, typename X::value_type(0), windows...);
}

// The adjoint of unfold: cols (in unfold's order: an input's dims up to its last spatial dim, the
// window dims, the input's other dims) added back onto an input of the given spatial extents (one
// per spatial dim, in order); the other dims keep cols' extents. Gradient: unfold of the gradient.
template <class... S, Tensor Cols>
  requires(sizeof...(S) > 0)
detail::folded_t<Cols, S...> fold(const Cols& cols, const std::array<std::int64_t, sizeof...(S)>& spatial_extents,
                                  detail::window_for<S>... windows) {
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
  const detail::op_call call(detail::halo_step<N>{"fold", detail::schedule_halos<X, S...>("fold", cols.mesh(), ext, ws), true}, cols);
  const auto& halos = call.step().halos;
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
