#pragma once
// stencil<Ds...>(x, width, boundary, f, fields...): a point update that reads its neighbours in
// place, as a simulation code's loop over a ghosted box does (PETSc's DMDA, ghost cells):
//
//   out[p] = f(at, fields[p]...)   where at(o_1, ..., o_N) is x at p moved by o_k along the k-th of Ds
//
// for every point p of x, each |o_k| at most `width`. Past the global ends x reads as zeros
// (boundary::zero_fill) or wraps around (boundary::wrap). `fields` are tensors of x's dims and
// layout (any element type; a right-hand side, coefficients) read at p. f runs in a kernel: on a
// GPU build it must be callable on the device, a KOKKOS_LAMBDA taking
// (const stencil_neighbours<T, sizeof...(Ds)>& at, the fields' element types...) (nvcc takes no
// generic device lambda; a functor's templated operator() will do).
//
// Each processor's box is copied once into a buffer widened by `width` along each of Ds, its ghost
// layers filled one dim after the other (so a pass carries the ghosts of the passes before it and
// the corners arrive too); then one kernel computes every point. Communication per dim of Ds, as
// halo_exchange's: none where it is not split; two `shift`s (a face to each neighbour) where it is
// split over one axis and every part holds at least `width` elements; else one allgather over its
// axes. Against shift + fuse (a shifted copy per neighbour, then the update reading them all), the
// field is read about twice per sweep instead of about twenty times.
//
// No gradient: f is a function of yours, not a composition the tape can differentiate; x or a field
// on the tape is refused by name (build the update from shift and fuse where a gradient is needed).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "shift.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {
namespace diagnostic {
template <class X, class Missing>
struct stencil_dim_not_in_tensor {
  static_assert(sizeof(Missing) == 0, "meshtensor: stencil<Ds...> names dims that the tensor X does not have (Missing)");
};
template <class X, class Ds>
struct stencil_dim_named_twice {
  static_assert(sizeof(Ds) == 0, "meshtensor: stencil<Ds...> names a dim twice (Ds)");
};
template <class X, class Field>
struct stencil_field_differs_in_dims_or_layout {
  static_assert(sizeof(Field) == 0,
                "meshtensor: a stencil's fields are read at the point being computed and must have the tensor's "
                "dims in its order and its layout, in its memory space (Field against X); relayout or copy the "
                "field first");
};
template <class X>
struct stencil_rank_above_six {
  static_assert(sizeof(X) == 0, "meshtensor: stencil takes tensors of rank 1 to 6 (Kokkos's MDRangePolicy)");
};
}  // namespace diagnostic

// What a stencil's function reads its neighbours through: at(o_1, ..., o_N) is the value at the
// point moved by o_k along the k-th of the stencil's dims; at(0, ..., 0) is the point itself.
template <class T, std::size_t N>
struct stencil_neighbours {
  const T* centre;
  Kokkos::Array<std::int64_t, N> stride;
  template <class... Offsets>
  KOKKOS_INLINE_FUNCTION T operator()(Offsets... o) const {
    static_assert(sizeof...(Offsets) == N, "meshtensor: a stencil's at(...) takes one offset per dim of the stencil");
    std::int64_t at = 0;
    std::size_t k = 0;
    ((at += static_cast<std::int64_t>(o) * stride[k++]), ...);
    return centre[at];
  }
};

namespace detail {

// The fields' values at a flat local index, appended to f's arguments one view after the other
// (a recursive pair rather than a tuple: a device functor holds it).
template <class... Vs>
struct point_fields {
  template <class F, class A, class... Got>
  KOKKOS_INLINE_FUNCTION auto call(const F& f, const A& at, std::int64_t, const Got&... got) const {
    return f(at, got...);
  }
};
template <class V, class... Vs>
struct point_fields<V, Vs...> {
  V head;
  point_fields<Vs...> tail;
  template <class F, class A, class... Got>
  KOKKOS_INLINE_FUNCTION auto call(const F& f, const A& at, std::int64_t idx, const Got&... got) const {
    return tail.call(f, at, idx, got..., head(idx));
  }
};
inline point_fields<> fields_of() { return {}; }
template <class V, class... Vs>
point_fields<V, Vs...> fields_of(const V& v, const Vs&... vs) {
  return {v, fields_of(vs...)};
}

// Runs body(index) over a box of rank R as an R-dimensional range, so that a point's offsets are
// sums of index times stride, not divisions of a flat index. On the host a tile is whole runs of
// the last dim, up to 4096 elements (Kokkos's default host tiles of 2 x 2 cost more than a point's
// work); devices keep Kokkos's tiles.
template <std::size_t R, class Body>
struct box_point {
  Body body;
  template <class... I>
  KOKKOS_INLINE_FUNCTION void operator()(I... i) const {
    body(Kokkos::Array<std::int64_t, R>{static_cast<std::int64_t>(i)...});
  }
};
template <class Exec, std::size_t R, class Body>
void for_each_in_box(const char* name, const std::array<std::int64_t, R>& ext, const Body& body) {
  const box_point<R, Body> point{body};
  if constexpr (R == 1) {
    kernels::parallel_for(name, kernels::range<Exec, Kokkos::IndexType<std::int64_t>>(0, ext[0]), point);
  } else {
    using policy = Kokkos::MDRangePolicy<Exec, Kokkos::Rank<R>, Kokkos::IndexType<std::int64_t>>;
    Kokkos::Array<std::int64_t, R> lower{}, upper{}, tile{};
    for (std::size_t d = 0; d < R; ++d) {
      lower[d] = 0;
      upper[d] = ext[d];
      tile[d] = 1;
    }
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) {
      const std::int64_t last = std::max<std::int64_t>(ext[R - 1], 1);
      tile[R - 1] = last;
      tile[R - 2] = std::clamp<std::int64_t>(4096 / last, 1, std::max<std::int64_t>(ext[R - 2], 1));
      kernels::parallel_for(name, kernels::policy<policy>(lower, upper, tile), point);
    } else {
      kernels::parallel_for(name, kernels::policy<policy>(lower, upper), point);
    }
  }
}

template <std::size_t R>
std::array<std::int64_t, R> row_major_strides(const std::array<std::int64_t, R>& ext) {
  std::array<std::int64_t, R> s{};
  std::int64_t n = 1;
  for (std::size_t d = R; d-- > 0;) {
    s[d] = n;
    n *= ext[d];
  }
  return s;
}

// Fills the ghost positions of box (along-view over one dim: own part at [width, width + own), global
// index begin + l) from src, whose element l sits at global index src.begin + l; global indices
// outside [0, extent) wrap or read zeros.
template <class Exec, class View>
void fill_ghosts(const along_view<View>& box, const along_view<View>& src, std::int64_t width, std::int64_t extent,
                 bool wrap) {
  using T = typename View::value_type;
  const std::int64_t own = box.n - 2 * width;
  along_view<View> ghosts = box;
  ghosts.n = 2 * width;
  kernels::parallel_for(
      "meshtensor::stencil_ghosts", along_range<Exec>(ghosts), KOKKOS_LAMBDA(std::int64_t o, std::int64_t q, std::int64_t i) {
        const std::int64_t l = q < width ? q : q + own;
        std::int64_t g = box.begin + l;
        if (wrap && extent > 0) g = ((g % extent) + extent) % extent;
        const std::int64_t s = g - src.begin;
        box.v(box.at(o, l, i)) = g >= 0 && g < extent && s >= 0 && s < src.n ? src.v(src.at(o, s, i)) : T(0);
      });
}

// The ghosts of dim d of the box, by the path chosen for it.
template <class Exec, class View>
void fill_halo_along(communicator& comm, const along_view<View>& box, const dim_split& split, shift_path path,
                     std::int64_t width, std::int64_t extent, bool wrap) {
  using T = typename View::value_type;
  const std::int64_t own = box.n - 2 * width;
  if (width == 0 || path == shift_path::none) return;
  if (split.count == 0) {  // the whole dim is here: the ghosts from the box's own middle
    fill_ghosts<Exec>(box, box, width, extent, wrap);
    return;
  }
  if (path == shift_path::gathered) {
    const auto part = pack_along<Exec>(box, width, own);
    along_view<View> full{allgather_along<Exec>(comm, split, part, box.outer, own, box.inner, extent), box.outer, extent,
                          box.inner, 0};
    fill_ghosts<Exec>(box, full, width, extent, wrap);
    return;
  }
  // Neighbours: the first `width` own positions go to the neighbour before (its right ghosts), the
  // last `width` to the one after (its left ghosts); without wrap the ends receive zeros.
  using buffer = mpi_buffer<Exec, T>;
  const int axis = split.axes[0];
  const std::int64_t count = box.outer * width * box.inner;
  const auto to_left = buffer::reading(pack_along<Exec>(box, width, width));
  const auto to_right = buffer::reading(pack_along<Exec>(box, own, width));
  const mpi_use use = wrap ? mpi_use::transfer : mpi_use::host_access;
  const auto from_left = buffer::writing(static_cast<std::size_t>(count), use);
  const auto from_right = buffer::writing(static_cast<std::size_t>(count), use);
  meshtensor::shift(comm, axis, to_right.data(), from_left.data(), count, 1, wrap);
  meshtensor::shift(comm, axis, to_left.data(), from_right.data(), count, -1, wrap);
  const auto lv = from_left.view(), rv = from_right.view();
  along_view<View> ghosts = box;
  ghosts.n = 2 * width;
  kernels::parallel_for(
      "meshtensor::stencil_ghosts", along_range<Exec>(ghosts), KOKKOS_LAMBDA(std::int64_t o, std::int64_t q, std::int64_t i) {
        const bool left = q < width;
        const std::int64_t l = left ? q : q + own, r = left ? q : q - width;
        box.v(box.at(o, l, i)) = (left ? lv : rv)((o * width + r) * box.inner + i);
      });
}

// Kernels over x's local box (functors, not lambdas: nvcc takes no device lambda in a function of
// two parameter packs, as stencil's Ds and fields). own, box and pad: per dim, x's strides, the
// box's, and the ghost width (width along Ds, 0 elsewhere).
template <std::size_t R, class XView, class BoxView>
struct into_box {
  XView x;
  BoxView box;
  Kokkos::Array<std::int64_t, R> own, boxed, pad;
  KOKKOS_INLINE_FUNCTION void operator()(const Kokkos::Array<std::int64_t, R>& p) const {
    std::int64_t from = 0, to = 0;
    for (std::size_t d = 0; d < R; ++d) {
      from += p[d] * own[d];
      to += (p[d] + pad[d]) * boxed[d];
    }
    box(to) = x(from);
  }
};
template <std::size_t R, std::size_t N, class BoxView, class OutView, class Values, class F>
struct stencil_point {
  BoxView box;
  OutView out;
  Values values;
  F f;
  Kokkos::Array<std::int64_t, R> own, boxed, pad;
  Kokkos::Array<std::int64_t, N> neighbour;  // the box's stride along each of Ds
  KOKKOS_INLINE_FUNCTION void operator()(const Kokkos::Array<std::int64_t, R>& p) const {
    using T = typename OutView::value_type;
    std::int64_t at = 0, to = 0;
    for (std::size_t d = 0; d < R; ++d) {
      at += (p[d] + pad[d]) * boxed[d];
      to += p[d] * own[d];
    }
    out(to) = static_cast<T>(values.call(f, stencil_neighbours<T, N>{box.data() + at, neighbour}, to));
  }
};

// The stencil's step: each dim's path, read by the run and by its plan (halo_exchange's plans).
template <Tensor X, Dim... Ds>
struct stencil_op {
  const char* name;
  std::array<shift_path, sizeof...(Ds)> paths;
  constexpr comm_plan plan() const {
    comm_plan p;
    std::size_t k = 0;
    ((p.then(paths[k] == shift_path::neighbours ? halo_exchange_plan<X, Ds>()
             : paths[k] == shift_path::gathered ? halo_exchange_general_plan<X, Ds>()
                                                : comm_plan{}),
      ++k),
     ...);
    return p;
  }
};

template <Tensor X, Dim D>
shift_path stencil_path(const X& x, std::int64_t width) {
  if (x.template extent<D>() == 0 || width == 0) return shift_path::none;
  return shift_uses_neighbours<D>(x, width) ? shift_path::neighbours : shift_path::gathered;
}

template <Tensor X, Dim... Ds>
constexpr bool stencil_dims_valid() {
  constexpr bool in_tensor = (contains_v<Ds, typename X::dims> && ...);
  if constexpr (!in_tensor) {
    (void)sizeof(diagnostic::stencil_dim_not_in_tensor<X, difference_t<type_list<Ds...>, typename X::dims>>);
    return false;
  } else if constexpr (!distinct_v<type_list<Ds...>>) {
    (void)sizeof(diagnostic::stencil_dim_named_twice<X, type_list<Ds...>>);
    return false;
  } else if constexpr (X::rank > 6) {
    (void)sizeof(diagnostic::stencil_rank_above_six<X>);
    return false;
  } else {
    return true;
  }
}

// A field is read through the kernel's own indices: the same dims in the same order, the same
// parts on each processor, and memory the kernel's space can read.
template <class X, class Field>
inline constexpr bool stencil_field_matches =
    std::is_same_v<typename Field::dims, typename X::dims> && std::is_same_v<typename Field::layout_type, typename X::layout_type> &&
    std::is_same_v<typename Field::memory_space, typename X::memory_space>;

}  // namespace detail

template <Dim... Ds, Tensor X, class F, Tensor... Fields>
X stencil(const X& x, std::int64_t width, boundary b, const F& f, const Fields&... fields) {
  static_assert(sizeof...(Ds) > 0, "meshtensor: stencil<Ds...> needs at least one dim to read neighbours along");
  if constexpr (!detail::stencil_dims_valid<X, Ds...>()) {
    return x;
  } else if constexpr (!(detail::stencil_field_matches<X, Fields> && ...)) {
    [&]<class... Fs>(type_list<Fs...>) {
      ((detail::stencil_field_matches<X, Fs> ? void() : (void)sizeof(diagnostic::stencil_field_differs_in_dims_or_layout<X, Fs>)),
       ...);
    }(type_list<Fields...>{});
    return x;
  } else {
    (detail::require_contiguous_along<"stencil", Ds, X>(), ...);
    using T = typename X::value_type;
    using Exec = typename X::execution_space;
    using Mem = typename X::memory_space;
    constexpr std::size_t R = X::rank, N = sizeof...(Ds);
    constexpr std::array<std::size_t, N> dim_at{X::template index_of<Ds>()...};
    std::string dims;
    ((dims += detail::cat(dims.empty() ? "'" : ", '", Ds::name(), "'")), ...);
    if (width < 0) throw shape_error(detail::cat("stencil along ", dims, ": negative width ", width));
    // The whole grid widened by width along Ds bounds every processor's box: where it fits in
    // int64 every box does, and the global extents are alike on every rank, so all throw alike.
    {
      constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();
      auto ext = x.extents();
      bool fits = true;
      for (std::size_t d : dim_at) {
        fits = fits && width <= (most - ext[d]) / 2;
        if (fits) ext[d] += 2 * width;
      }
      std::int64_t elements = 1;
      for (auto e : ext) fits = fits && !__builtin_mul_overflow(elements, e, &elements);
      if (!fits)
        throw shape_error(detail::cat("stencil along ", dims, ": width ", width, " widens x ", X::type_name(), x.shape_string(),
                                      " past 2^63 elements"));
    }
    // All ranks see the same extents and the same flags: they throw alike.
    ((fields.extents() != x.extents()
          ? throw shape_error(detail::cat("stencil along ", dims, ": field ", Fields::type_name(), fields.shape_string(),
                                          " differs in extents from x ", X::type_name(), x.shape_string()))
          : void()),
     ...);
    if (!detail::recording_paused() && (x.tracks_grad() || (fields.tracks_grad() || ...)))
      throw error(detail::cat("stencil along ", dims, " has no gradient (it runs a function of yours): its input ",
                              X::type_name(), x.shape_string(), " or a field is on the tape; call it under no_grad, ",
                              "or build the update from shift and fuse, which have gradients"));
    const detail::stencil_op<X, Ds...> op{"stencil", {detail::stencil_path<X, Ds>(x, width)...}};
    const detail::op_call call(op, x);
    const bool wrap = b == boundary::wrap;

    // The box: x's slice widened by width along each of Ds, x copied into its middle.
    std::array<std::int64_t, R> pad{}, box_ext = x.local_extents();
    for (std::size_t d : dim_at) {
      pad[d] = width;
      box_ext[d] += 2 * width;
    }
    std::int64_t box_size = 1;
    for (auto e : box_ext) box_size *= e;
    const Kokkos::View<T*, Mem> box = detail::view_pool<T, Mem>::get().allocate(static_cast<std::size_t>(box_size));
    const auto box_stride = detail::row_major_strides<R>(box_ext);
    const auto own_stride = detail::row_major_strides<R>(x.local_extents());
    Kokkos::Array<std::int64_t, R> bs{}, os{}, ps{};
    for (std::size_t d = 0; d < R; ++d) {
      bs[d] = box_stride[d];
      os[d] = own_stride[d];
      ps[d] = pad[d];
    }
    detail::for_each_in_box<Exec, R>("meshtensor::stencil_box", x.local_extents(),
                                     detail::into_box<R, typename X::view_type, Kokkos::View<T*, Mem>>{x.view(), box, os, bs, ps});
    // The ghosts, dim after dim.
    std::size_t k = 0;
    (
        [&] {
          constexpr std::size_t d = X::template index_of<Ds>();
          auto along = detail::local_along<Ds>(x);
          along.v = box;
          along.outer = 1;
          along.inner = 1;
          for (std::size_t e = 0; e < R; ++e) (e < d ? along.outer : along.inner) *= (e == d ? 1 : box_ext[e]);
          along.n = box_ext[d];
          along.begin = x.template offset<Ds>() - width;
          detail::fill_halo_along<Exec>(x.mesh().communicator(), along, X::splits[d], call.op().paths[k], width,
                                        x.template extent<Ds>(), wrap);
          ++k;
        }(),
        ...);
    // The update: every point from the box, its fields at the point.
    X out(x.mesh(), x.extents(), uninitialized);
    Kokkos::Array<std::int64_t, N> neighbour_stride{};
    for (std::size_t j = 0; j < N; ++j) neighbour_stride[j] = box_stride[dim_at[j]];
    const auto values = detail::fields_of(fields.view()...);
    const Kokkos::View<const T*, Mem> from_box = box;
    detail::for_each_in_box<Exec, R>(
        "meshtensor::stencil", x.local_extents(),
        detail::stencil_point<R, N, Kokkos::View<const T*, Mem>, std::remove_cvref_t<decltype(out.view())>,
                              std::remove_cvref_t<decltype(values)>, F>{
            from_box, out.view(), values, f, os, bs, ps, neighbour_stride});
    return out;
  }
}

}  // namespace meshtensor
