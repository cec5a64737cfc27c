#pragma once
// shift<D>(x, offset, boundary): out[.., g, ..] = x[.., g - offset, ..] along D, wrapping around or
// filling with zeros; halo_exchange<D>(x, width): each processor's slice widened by `width`
// elements of its neighbours' slices on each side, for stencils on spatially partitioned data.
// Communication: none when D is not split. When D is split over one axis and |offset| (or width)
// is at most D's smallest part: shift sends one slab of |offset| elements along D to the
// neighbouring processor on that axis (one counted `shift`), halo_exchange two (one per side).
// Otherwise (D split over several axes, or a longer reach): one allgather over D's axes.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdlib>

#include "../geometry/window.hpp"
#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

// What comes in at the ends: the elements that fell off the other end, or zeros.
enum class boundary { zero_fill, wrap };

namespace detail {

// out(o, l, i) = src at global index (out.begin + l - offset) along D, over src's whole extent
// (src.begin == 0, src.n == extent), wrapped modulo the extent or zero outside it. Over (o, l, i)
// as a 3-D range, not a flat index: three 64-bit divisions per element made a stencil's shifts
// cost several times their copy on the CPU.
template <class Exec, class OutView, class View>
void shift_from_full(const OutView& ov, const along_view<View>& dst, const along_view<View>& src,
                     std::int64_t offset, bool wrap) {
  using T = typename View::value_type;
  const std::int64_t n = src.n;
  kernels::parallel_for(
      "meshtensor::shift_local", along_range<Exec>(dst),
      KOKKOS_LAMBDA(std::int64_t o, std::int64_t l, std::int64_t i) {
        std::int64_t s = dst.begin + l - offset;
        if (wrap && n > 0) s = ((s % n) + n) % n;
        ov(dst.at(o, l, i)) = (s >= 0 && s < n) ? src.v(src.at(o, s, i)) : T(0);
      });
}

// Sends a slab of `count` elements along D (local positions [from, from + count)) to the
// neighbour at `direction` (+1 or -1) on D's one axis; returns the slab received from the other side.
template <Dim D, Tensor X>
typename X::view_type neighbour_slab(const X& x, std::int64_t from, std::int64_t count, int direction, bool wrap) {
  using T = typename X::value_type;
  constexpr auto s = X::layout_type::template split_of<D>();
  const auto loc = local_along<D>(x);
  using buffer = mpi_buffer<typename X::execution_space, T>;
  const auto send = buffer::reading(pack_along<typename X::execution_space>(loc, from, count));
  const auto recv = buffer::writing(send.size(), wrap ? mpi_use::transfer : mpi_use::host_access);
  meshtensor::shift(x.mesh().communicator(), s.axes[0], send.data(), recv.data(), static_cast<std::int64_t>(send.size()),
                    direction, wrap);
  return recv.view();
}

// The neighbour path needs every part of D to hold at least |reach| elements (parts differ by one
// when the split is uneven): geometry's shift_halo_path, from the placement, so all processors
// take the same path.
template <Dim D, Tensor X>
bool shift_uses_neighbours(const X& x, std::int64_t reach) {
  constexpr std::size_t d = X::template index_of<D>();
  return shift_halo_path(X::splits[d], x.placement().min_part_extent(d), reach) == halo_path::neighbours;
}

enum class shift_path { none, neighbours, gathered };

// Which way a shift of x by `reach` along D goes (the same on every processor): nothing to move
// when D is empty, the neighbours' slabs when every part holds at least |reach| elements and D is
// split over one axis, else D gathered whole (an allgather over its axes; none when not split).
template <Dim D, Tensor X>
shift_path shift_path_of(const X& x, std::int64_t reach) {
  if (x.template extent<D>() == 0) return shift_path::none;
  return shift_uses_neighbours<D>(x, reach) ? shift_path::neighbours : shift_path::gathered;
}

// Non-recording shift, also the gradient rule's kernel.
template <Dim D, Tensor X>
X shift_impl(const X& x, std::int64_t offset, boundary b, shift_path path) {
  const collective_subject subject(&X::type_name);
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  const bool wrap = b == boundary::wrap;
  X out(x.mesh(), x.extents(), uninitialized);  // every path writes every element (none: no elements)
  const auto dst = local_along<D>(out);
  if (path == shift_path::none) return out;
  if (path == shift_path::gathered) {
    shift_from_full<Exec>(out.view(), dst, full_along<D>(x), offset, wrap);
    return out;
  }
  // Neighbour path: offset > 0 takes the last `offset` elements of the previous part, offset < 0
  // the first -offset of the next; the rest is local.
  const std::int64_t L = dst.n, reach = std::llabs(offset);
  const auto slab = neighbour_slab<D>(x, offset > 0 ? L - reach : 0, reach, offset >= 0 ? 1 : -1, wrap);
  const auto src = local_along<D>(x);
  auto ov = out.view();
  kernels::parallel_for(
      "meshtensor::shift_neighbour", along_range<Exec>(dst), KOKKOS_LAMBDA(std::int64_t o, std::int64_t l, std::int64_t i) {
        const std::int64_t s = l - offset;
        T v;
        if (s >= 0 && s < L)
          v = src.v(src.at(o, s, i));
        else
          v = slab((o * reach + (offset > 0 ? l : l - (L - reach))) * dst.inner + i);
        ov(dst.at(o, l, i)) = v;
      });
  return out;
}

}  // namespace detail

// ---- plans ------------------------------------------------------------------------------------
// shift when |offset| <= the smallest part of D: one `shift` along D's axis when D is split over one
// axis; one allgather over D's axes when it is split over several; nothing when it is not split.
template <Tensor X, Dim D>
constexpr comm_plan shift_plan() {
  constexpr auto s = X::layout_type::template split_of<D>();
  if constexpr (s.count == 1) return comm_plan{}.then(collective::shift, s.mask());
  return comm_plan{}.then(collective::allgather, s.mask());
}
// shift with |offset| > the smallest part of D: one allgather over D's axes (nothing when not split).
template <Tensor X, Dim D>
constexpr comm_plan shift_general_plan() {
  return comm_plan{}.then(collective::allgather, X::layout_type::template split_of<D>().mask());
}
// halo_exchange when width <= the smallest part of D: two `shift`s (one per side) when D is split over
// one axis, else as shift_plan.
template <Tensor X, Dim D>
constexpr comm_plan halo_exchange_plan() {
  constexpr auto s = X::layout_type::template split_of<D>();
  if constexpr (s.count == 1) return comm_plan{}.then(collective::shift, s.mask()).then(collective::shift, s.mask());
  return shift_general_plan<X, D>();
}
template <Tensor X, Dim D>
constexpr comm_plan halo_exchange_general_plan() {
  return shift_general_plan<X, D>();
}

namespace detail {
// shift's and halo_exchange's step: the path, read by the op's execution and by its plan, which is
// the public plan of that path (so the door checks those plans on every call).
template <Tensor X, Dim D>
struct shift_op {
  const char* name;
  shift_path path;
  bool both_sides = false;  // halo_exchange
  constexpr comm_plan plan() const {
    if (path == shift_path::neighbours) return both_sides ? halo_exchange_plan<X, D>() : shift_plan<X, D>();
    if (path == shift_path::gathered) return both_sides ? halo_exchange_general_plan<X, D>() : shift_general_plan<X, D>();
    return {};
  }
};
}  // namespace detail

// ---- ops --------------------------------------------------------------------------------------
// x shifted by offset along D (positive: towards higher indices). Gradient: the shift by -offset
// with the same boundary (zero-fill's adjoint is the zero-fill shift back).
template <Dim D, Tensor X>
X shift(const X& x, std::int64_t offset, boundary b = boundary::zero_fill) {
  detail::require_contiguous_along<"shift", D, X>();
  const detail::op_call call(detail::shift_op<X, D>{"shift", detail::shift_path_of<D>(x, offset)}, x);
  X out = detail::shift_impl<D>(x, offset, b, call.op().path);
  detail::record<X>(
      out,
      [x = detail::node_only(x), offset, b](const X& g) { detail::push_grad(x, detail::shift_impl<D>(g, -offset, b, detail::shift_path_of<D>(g, -offset))); },
      x);
  return out;
}

// The result of halo_exchange: this processor's slice of a tensor X, widened along D by `width`
// elements on each side. It is not a distributed tensor (neighbouring pieces overlap), so it is
// a plain local array: flat row-major over local_extents (D's entry is local extent + 2 * width),
// in X's memory space; element l along D is global index begin + l. Elements beyond the global
// ends hold zeros (boundary::zero_fill) or wrap around (boundary::wrap). It carries no gradient.
template <Tensor X, Dim D>
struct halo_slice {
  using value_type = typename X::value_type;
  using view_type = typename X::view_type;
  static constexpr std::size_t dim_index = X::template index_of<D>();
  view_type data;
  typename X::extents_type local_extents{};
  std::int64_t width = 0;
  std::int64_t begin = 0;

  const view_type& view() const { return data; }
  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : local_extents) n *= e;
    return n;
  }
  // Flat index of a local multi-index (D's entry counts from the start of the left halo).
  std::int64_t flat(const typename X::extents_type& idx) const {
    std::int64_t f = 0;
    for (std::size_t i = 0; i < X::rank; ++i) f = f * local_extents[i] + idx[i];
    return f;
  }
};

// x's local slice with `width` neighbour elements on each side along D.
template <Dim D, Tensor X>
halo_slice<X, D> halo_exchange(const X& x, std::int64_t width, boundary b = boundary::zero_fill) {
  detail::require_contiguous_along<"halo_exchange", D, X>();
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  if (width < 0) throw shape_error(detail::cat("halo_exchange: negative width ", width, " along dim '", D::name(), "'"));
  // An empty D still takes the gathered path (every processor's empty halo slice comes from it).
  const auto path = x.template extent<D>() != 0 && detail::shift_uses_neighbours<D>(x, width) ? detail::shift_path::neighbours
                                                                                              : detail::shift_path::gathered;
  const detail::op_call call(detail::shift_op<X, D>{"halo_exchange", path, true}, x);
  const bool wrap = b == boundary::wrap;
  halo_slice<X, D> h;
  h.width = width;
  h.local_extents = x.local_extents();
  const std::int64_t L = x.template local_extent<D>();
  h.local_extents[h.dim_index] = L + 2 * width;
  h.begin = x.offsets()[h.dim_index] - width;
  h.data = detail::view_pool<typename X::value_type, typename X::memory_space>::get().allocate(
      static_cast<std::size_t>(h.size()));
  auto dst = detail::local_along<D>(x);
  dst.v = h.data;
  dst.n = L + 2 * width;
  dst.begin = h.begin;
  if (call.op().path != detail::shift_path::neighbours) {
    detail::shift_from_full<Exec>(h.data, dst, detail::full_along<D>(x), 0, wrap);
    return h;
  }
  const auto left = detail::neighbour_slab<D>(x, L - width, width, 1, wrap);
  const auto right = detail::neighbour_slab<D>(x, 0, width, -1, wrap);
  const auto src = detail::local_along<D>(x);
  auto hv = h.data;
  const std::int64_t n = dst.n, inner = dst.inner, w = width;
  kernels::parallel_for(
      "meshtensor::halo", kernels::range<Exec>(0, h.size()), KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (n * inner), l = (idx / inner) % n, i = idx % inner;
        T v;
        if (l < w)
          v = left((o * w + l) * inner + i);
        else if (l < w + L)
          v = src.v(src.at(o, l - w, i));
        else
          v = right((o * w + l - w - L) * inner + i);
        hv(idx) = v;
      });
  return h;
}

}  // namespace meshtensor
