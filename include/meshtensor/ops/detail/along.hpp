#pragma once
// Helpers for ops that work along one dim D: a tensor's local data seen as [outer, n, inner]
// around D, the same data gathered over D's axes ("full along D"), and the extent checks of ops
// that change D's extent. Communication: full_along allgathers over D's axes when D is split.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../../runtime/collectives.hpp"
#include "../reduce.hpp"
#include "kernels.hpp"

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
  r.begin = x.offsets()[a];
  return r;
}

// Part index (row-major over the rule's axes, in the rule's order) of each rank of the
// sub-communicator of those axes (row-major over the same axes, in mesh order).
inline std::vector<int> parts_by_subrank(const communicator& c, const dim_split& s) {
  std::vector<int> mesh_order(s.axes.begin(), s.axes.begin() + s.count);
  std::sort(mesh_order.begin(), mesh_order.end());
  const int n = static_cast<int>(parts_of(s, c.sizes()));
  std::vector<int> parts(static_cast<std::size_t>(n));
  std::vector<int> coords(c.sizes().size(), 0);
  for (int sub = 0; sub < n; ++sub) {
    int rest = sub;
    for (auto it = mesh_order.rbegin(); it != mesh_order.rend(); ++it) {
      coords[*it] = rest % c.sizes()[*it];
      rest /= c.sizes()[*it];
    }
    parts[sub] = static_cast<int>(part_index(s, c.sizes(), coords));
  }
  return parts;
}

// True when the rule of D names its axes in mesh order, so that sub-communicator rank order is
// part order (a scan over the sub-communicator then runs in part order).
template <class L, class D>
constexpr bool rule_in_mesh_order() {
  constexpr auto s = L::template split_of<D>();
  for (int i = 1; i < s.count; ++i)
    if (s.axes[i] < s.axes[i - 1]) return false;
  return true;
}

// Gathers host buffers of n_per_rank elements (each [outer, n, inner]) over D's axes and returns
// the data of all parts in part order, as [outer, parts * n, inner] in memory space Mem.
template <class T, class Mem>
Kokkos::View<T*, Mem> allgather_along(communicator& comm, const dim_split& s, const T* send, std::int64_t outer,
                                      std::int64_t n, std::int64_t inner) {
  const auto parts = parts_by_subrank(comm, s);
  const auto P = static_cast<std::int64_t>(parts.size());
  const std::int64_t each = outer * n * inner;
  Kokkos::View<T*, Kokkos::HostSpace> recv(Kokkos::view_alloc(std::string("meshtensor::allgather_along"), Kokkos::WithoutInitializing),
                                           static_cast<std::size_t>(P * each));
  Kokkos::View<T*, Kokkos::HostSpace> full(Kokkos::view_alloc(std::string("meshtensor::full_along"), Kokkos::WithoutInitializing),
                                           static_cast<std::size_t>(P * each));
  allgather(comm, s.mask(), send, each, recv.data());
  Kokkos::View<int*, Kokkos::HostSpace> part_of("meshtensor::parts", parts.size());
  for (std::size_t q = 0; q < parts.size(); ++q) part_of(q) = parts[q];
  const std::int64_t total = P * each;
  Kokkos::parallel_for(
      "meshtensor::reorder_parts", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, total),
      [=](std::int64_t idx) {
        const std::int64_t sub = idx / each, r = idx % each;
        const std::int64_t o = r / (n * inner), l = (r / inner) % n, i = r % inner;
        full((o * P * n + part_of(sub) * n + l) * inner + i) = recv(idx);
      });
  Kokkos::DefaultHostExecutionSpace{}.fence();
  return Kokkos::create_mirror_view_and_copy(Mem{}, full);
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
    auto h = host_view(x.view());
    along_view<typename X::view_type> r = loc;
    r.v = allgather_along<typename X::value_type, typename X::memory_space>(x.mesh().communicator(), s, h.data(),
                                                                           loc.outer, loc.n, loc.inner);
    r.n = x.template extent<D>();
    r.begin = 0;
    return r;
  }
}

// An op that gives D a new extent in a result of type X must keep it divisible by D's parts; all
// ranks check alike (extents and mesh sizes are shared).
template <Dim D, Tensor X>
void check_parts(const char* op, const typename X::mesh_type& m, std::int64_t extent) {
  constexpr auto s = X::layout_type::template split_of<D>();
  const auto& c = m.communicator();
  const auto parts = parts_of(s, c.sizes());
  if (extent < 0) throw shape_error(cat(op, ": dim '", D::name(), "' would get negative extent ", extent));
  if (extent % parts != 0) {
    std::string axes;
    for (int k = 0; k < s.count; ++k)
      axes += cat(k ? " x " : "", c.axis_names()[s.axes[k]], "(", c.sizes()[s.axes[k]], ")");
    throw shape_error(cat(op, ": the result's dim '", D::name(), "' would have extent ", extent, ", which is split over ",
                          axes, " = ", parts, " parts; ", extent, " is not divisible by ", parts));
  }
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
  Kokkos::parallel_for(
      "meshtensor::place_along", Kokkos::RangePolicy<typename Out::execution_space>(0, out.local_size()),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (dst.n * dst.inner), l = (idx / dst.inner) % dst.n, i = idx % dst.inner;
        const std::int64_t s = dst.begin + l - start;
        if (s >= lo && s < hi) ov(idx) = src.v(src.at(o, s - lo, i));
      });
  fence<Out>();
}

// Host copy of a [outer, count, inner] block of along-data starting at local position from.
template <class Exec, class View>
auto pack_along(const along_view<View>& src, std::int64_t from, std::int64_t count) {
  using T = typename View::value_type;
  Kokkos::View<T*, typename View::memory_space> slab(
      Kokkos::view_alloc(std::string("meshtensor::slab"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(src.outer * count * src.inner));
  Kokkos::parallel_for(
      "meshtensor::pack_along", Kokkos::RangePolicy<Exec>(0, src.outer * count * src.inner),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (count * src.inner), l = (idx / src.inner) % count, i = idx % src.inner;
        slab(idx) = src.v(src.at(o, from + l, i));
      });
  Exec{}.fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, slab);
}

}  // namespace meshtensor::detail
