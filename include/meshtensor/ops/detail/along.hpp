#pragma once
// Helpers for ops that work along one dim D: a tensor's local data seen as [outer, n, inner]
// around D, the same data gathered over D's axes ("full along D"), and the extent checks of ops
// that change D's extent. Communication: full_along allgathers over D's axes when D is split.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../../runtime/collectives.hpp"
#include "../sum_broadcast.hpp"
#include "op_support.hpp"
#include "../../kernels/launch.hpp"

namespace meshtensor {
namespace diagnostic {
template <fixed_string Op, class Dim>
struct op_along_zigzag_dim {
  static_assert(sizeof(Dim) == 0,
                "meshtensor: this op works along a dim that the tensor's layout cuts zigzag "
                "(zigzag<Dim, Axes...>: two ranges per processor) and needs one range per processor; "
                "relayout the tensor to split<Dim, Axes...> first");
};
}  // namespace diagnostic

namespace detail {
// Ops along D that need each processor's part of D to be one range (a running sum, a shift, a
// slice, halos) refuse a zigzag D by name, at compile time.
template <fixed_string Op, Dim D, Tensor X>
constexpr void require_contiguous_along() {
  if constexpr (X::layout_type::template split_of<D>().zigzag()) (void)sizeof(diagnostic::op_along_zigzag_dim<Op, D>);
}
}  // namespace detail
}  // namespace meshtensor

namespace meshtensor::detail {

// Flat data of shape [outer, n, inner]; element (o, l, i) sits at global index begin + l along D.
template <class View>
struct along_view {
  View v;
  std::int64_t outer = 1, n = 0, inner = 1;
  std::int64_t begin = 0;
  KOKKOS_INLINE_FUNCTION std::int64_t at(std::int64_t o, std::int64_t l, std::int64_t i) const {
    return (o * n + l) * inner + i;
  }
};

// The range (outer, n, inner) of an along_view, for kernels indexed (o, l, i) rather than by a flat
// index they would divide back into the three. On the host a tile is a whole inner run, or where
// runs are short (a shift along the last dim) up to 4096 elements of [n, inner]: Kokkos's default
// host tiles of 2 x 2 cost more than a short run's copy, and a whole [n, inner] block would leave a
// long 1-D shift one tile for every thread. Devices keep Kokkos's tiles (a tile is a block of threads
// there, whose size is bounded). 64-bit indices: the default is the space's size_type, 32 bits on
// CUDA.
template <class Exec>
using along_policy = Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>, Kokkos::IndexType<std::int64_t>>;
template <class Exec, class View>
along_policy<Exec> along_range(const along_view<View>& a) {
  using policy = along_policy<Exec>;
  using index = std::int64_t;
  const index outer = a.outer, n = a.n, inner = a.inner;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) {
    constexpr index long_run = 64, tile_elements = 4096;
    const index one = 1, short_runs = std::clamp(tile_elements / std::max(inner, one), one, std::max(n, one));
    const index tile_n = inner >= long_run ? one : short_runs;
    return policy(kernels::instance<Exec>(), {0, 0, 0}, {outer, n, inner}, {one, tile_n, std::max(inner, one)});
  } else {
    return policy(kernels::instance<Exec>(), {0, 0, 0}, {outer, n, inner});
  }
}

// Outer and inner products of the local extents of X around dim position a.
template <std::size_t R>
std::pair<std::int64_t, std::int64_t> outer_inner(const std::array<std::int64_t, R>& ext, std::size_t a) {
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < R; ++i) {
    if (i < a) outer *= ext[i];
    if (i > a) inner *= ext[i];
  }
  return {outer, inner};
}

template <Dim D, Tensor X>
along_view<typename X::view_type> local_along(const X& x) {
  constexpr std::size_t a = X::template index_of<D>();
  along_view<typename X::view_type> r;
  r.v = x.view();
  std::tie(r.outer, r.inner) = outer_inner<X::rank>(x.local_extents(), a);
  r.n = x.local_extents()[a];
  // A zigzag part starts twice: begin is left 0 there, for the ops that read local rows only
  // (local_chunk); those that read begin refuse a zigzag D (require_contiguous_along).
  if constexpr (!X::layout_type::template split_of<D>().zigzag()) r.begin = x.template offset<D>();
  return r;
}

// Gathers local data [outer, n, inner] over D's axes (n: this processor's part of D's extent,
// which differs between parts when the split is uneven) and returns the data of all parts in part
// order, as [outer, extent, inner] in Exec's memory space.
template <class Exec, class T>
Kokkos::View<T*, typename Exec::memory_space> allgather_along(communicator& comm, const dim_split& s,
                                                              const Kokkos::View<T*, typename Exec::memory_space>& local,
                                                              std::int64_t outer, std::int64_t n, std::int64_t inner,
                                                              std::int64_t extent) {
  using Mem = typename Exec::memory_space;
  const auto parts = parts_by_subrank(s, comm.shape(), comm.coords());
  const placement<1> p({s}, comm.shape(), {extent});
  const auto P = static_cast<int>(parts.size());
  // Per sub-rank: its block of rows (its part of D, whole along the others), back to back.
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(P));
  for (int q = 0; q < P; ++q) sizes[q] = outer * p.part_extent(0, parts[q]) * inner;
  const exchange_blocks blocks(sizes);
  const std::int64_t total = blocks.total;
  // Per sub-rank: its part's offset and extent along D, and where its block starts in recv.
  const auto where = host_table<std::int64_t>(3 * static_cast<std::size_t>(P));
  for (int q = 0; q < P; ++q) {
    where(3 * q) = p.part_offset(0, parts[q]);
    where(3 * q + 1) = p.part_extent(0, parts[q]);
    where(3 * q + 2) = blocks.displs[q];
  }
  using buffer = mpi_buffer<Exec, T>;
  const auto send = buffer::reading(local);
  const auto received = buffer::writing(static_cast<std::size_t>(total));
  allgatherv(comm, s.mask(), send.data(), outer * n * inner, received.data(), blocks.counts, blocks.displs);
  const auto recv = received.view();
  const auto parts_at = kernels::copy_to(Mem{}, where);
  Kokkos::View<T*, Mem> full = view_pool<T, Mem>::get().allocate(static_cast<std::size_t>(total));
  kernels::parallel_for(
      "meshtensor::reorder_parts", kernels::range<Exec>(0, P * outer), KOKKOS_LAMBDA(std::int64_t qo) {
        const std::int64_t q = qo / outer, o = qo % outer;
        const std::int64_t off = parts_at(3 * q), nq = parts_at(3 * q + 1), at = parts_at(3 * q + 2);
        for (std::int64_t l = 0; l < nq; ++l)
          for (std::int64_t i = 0; i < inner; ++i)
            full((o * extent + off + l) * inner + i) = recv(at + (o * nq + l) * inner + i);
      });
  return full;
}

// x's local data widened to the whole extent of D: an allgather over D's axes when D is split,
// x's own slice (no copy) when it is not.
template <Dim D, Tensor X>
along_view<typename X::view_type> full_along(const X& x) {
  constexpr auto s = X::layout_type::template split_of<D>();
  auto loc = local_along<D>(x);
  if constexpr (s.count == 0) {
    return loc;
  } else {
    along_view<typename X::view_type> r = loc;
    r.v = allgather_along<typename X::execution_space>(x.mesh().communicator(), s, x.view(), loc.outer, loc.n, loc.inner,
                                                                           x.template extent<D>());
    r.n = x.template extent<D>();
    r.begin = 0;
    return r;
  }
}

// An op that gives D a new extent: it must not be negative (any extent is placeable; uneven
// parts follow the placement rule). All ranks check alike (extents are shared).
template <Dim D, Tensor X>
void check_parts(const char* op, const typename X::mesh_type&, std::int64_t extent) {
  if (extent < 0) throw shape_error(cat(op, ": dim '", D::name(), "' would get negative extent ", extent));
}

// X's extents with D's replaced.
template <Dim D, Tensor X>
typename X::extents_type with_extent(const X& x, std::int64_t extent) {
  auto e = x.extents();
  e[X::template index_of<D>()] = extent;
  return e;
}

// Writes src into out where they overlap along D: out's element at global index g takes src's
// element at global index g - start (out's other dims match src's). Others are left as they are.
template <Dim D, Tensor Out, class View>
void place_along(Out& out, const along_view<View>& src, std::int64_t start) {
  const auto dst = local_along<D>(out);
  auto ov = out.view();
  const std::int64_t lo = src.begin, hi = src.begin + src.n;
  kernels::parallel_for(
      "meshtensor::place_along", kernels::range<typename Out::execution_space>(0, out.local_size()),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (dst.n * dst.inner), l = (idx / dst.inner) % dst.n, i = idx % dst.inner;
        const std::int64_t s = dst.begin + l - start;
        if (s >= lo && s < hi) ov(idx) = src.v(src.at(o, s - lo, i));
      });
}

// A [outer, count, inner] block of along-data starting at local position from, packed.
// The return type is spelled out: nvcc allows no device lambda in a function with a deduced one.
template <class Exec, class View>
Kokkos::View<typename View::value_type*, typename View::memory_space> pack_along(const along_view<View>& src,
                                                                               std::int64_t from, std::int64_t count) {
  using T = typename View::value_type;
  Kokkos::View<T*, typename View::memory_space> slab =
      view_pool<T, typename View::memory_space>::get().allocate(static_cast<std::size_t>(src.outer * count * src.inner));
  kernels::parallel_for(
      "meshtensor::pack_along", kernels::range<Exec>(0, src.outer * count * src.inner),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (count * src.inner), l = (idx / src.inner) % count, i = idx % src.inner;
        slab(idx) = src.v(src.at(o, from + l, i));
      });
  return slab;
}

}  // namespace meshtensor::detail
