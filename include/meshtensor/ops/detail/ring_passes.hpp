#pragma once
// What einsum_gathered and einsum_scattered (ops/einsum_gathered.hpp, ops/einsum_scattered.hpp)
// share: a dim D split over axes A into P parts (geometry/ring_parts.hpp), and two passes around
// the ring of A in which each step's products run while the next hop is in flight:
//   for_each_part_gathered: every part of a tensor split along D, this processor's own first, then
//     each as it arrives (the allgather's data, P - 1 hops, each part used as soon as it is here);
//   ring_reduce_scattered: this processor's addends for every part summed around the ring, each
//     sum ending on the part's owner (the reduce_scatter's data, P - 1 hops; the next addend is
//     computed while the sum so far travels).
// Each hop is one `shift` over A (tensor/ring_hop.hpp, ring_exchange): in a plan it sits over
// the step's products (plan/timeline.hpp). Addends are summed in float for bf16 (rounded once, as
// the reduce_scatter of bf16 partials), in their own type otherwise.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../../element/bf16.hpp"
#include "../../geometry/ring_parts.hpp"
#include "../../kernels/chunk_rows.hpp"
#include "../../kernels/launch.hpp"
#include "../../kernels/pool.hpp"
#include "../../kernels/rows.hpp"
#include "../../runtime/collectives.hpp"
#include "../../tensor/mpi_buffer.hpp"
#include "../../tensor/ring_hop.hpp"
#include "../../tensor/tensor.hpp"
#include "along.hpp"

namespace meshtensor::detail {

// The one dim whose split differs between layouts From and To, where To holds it whole and From
// splits it in one range per processor (einsum_gathered's G from x, einsum_scattered's result
// from the product's): its position, or -1 where there is no such single dim.
template <std::size_t R>
constexpr int the_one_split_dim(const std::array<dim_split, R>& split, const std::array<dim_split, R>& whole) {
  int found = -1;
  for (std::size_t d = 0; d < R; ++d) {
    if (split[d] == whole[d]) continue;
    if (found != -1 || whole[d].count != 0 || split[d].count == 0 || split[d].zigzag()) return -1;
    found = static_cast<int>(d);
  }
  return found;
}
template <std::size_t I, class List>
struct nth_dim;
template <std::size_t I, class... Ds>
struct nth_dim<I, type_list<Ds...>> {
  using type = std::tuple_element_t<I, std::tuple<Ds...>>;
};

// The ring of x's split of D.
template <Dim D, Tensor X>
ring_parts ring_parts_along(const X& x) {
  const communicator& comm = x.mesh().communicator();
  return ring_parts_of(X::layout_type::template split_of<D>(), comm.shape(), comm.coords(), x.template extent<D>());
}

// Rows [begin, begin + n) along D of x, whose layout holds D whole, as an X of D's extent n (x
// itself where they are all of D).
template <Dim D, Tensor X>
X rows_of_part(const X& x, std::int64_t begin, std::int64_t n) {
  if (begin == 0 && n == x.template extent<D>()) return x;
  X out(x.mesh(), with_extent<D>(x, n), uninitialized);
  const row_shape s = rows_along<D>(x);
  copy_rows_out<typename X::execution_space>(x.view(), s.outer, s.n, s.inner, begin, n, out.view());
  return out;
}

// part (D's extent n) written over dst's rows [begin, begin + n) along D (dst holds D whole).
template <Dim D, Tensor X>
void put_part_rows(const X& part, const X& dst, std::int64_t begin) {
  const row_shape s = rows_along<D>(dst);
  copy_rows_in<typename X::execution_space>(part.view(), s.outer, s.n, s.inner, begin, part.template extent<D>(),
                                            dst.view());
}

// Calls use(part, p) for every part p of x along D (x's layout splits D over ring.axes, one range
// per processor; G holds D whole and x's other dims as x): part is a G of D's extent
// ring.extent[p], x's own slice first, then each as it arrives. The hop of the next part is posted
// before use() runs on this one and awaited after it.
template <Dim D, Tensor G, Tensor X, class Use>
void for_each_part_gathered(const X& x, const ring_parts& ring, Use&& use) {
  using Exec = typename X::execution_space;
  using T = typename X::value_type;
  communicator& comm = x.mesh().communicator();
  const row_shape s = rows_along<D>(x);
  const std::int64_t per_position = s.outer * s.inner;  // elements of the slice per position along D
  Kokkos::View<T*, typename Exec::memory_space> here = x.view();
  std::shared_ptr<void> here_claim;
  for (int step = 0; step < ring.parts; ++step) {
    const int p = ring.part(step);
    const G part(x.mesh(), with_extent<D>(x, ring.extent[static_cast<std::size_t>(p)]), here);
    if (step == ring.parts - 1) {
      use(part, p);
      break;
    }
    const int next = ring.part(step + 1);
    const std::int64_t send_n = per_position * ring.extent[static_cast<std::size_t>(p)];
    const std::int64_t recv_n = per_position * ring.extent[static_cast<std::size_t>(next)];
    auto arrived = ring_hop<Exec>(comm, ring.axes, ring.to, ring.from, here, send_n, recv_n, true, [&] { use(part, p); });
    here = arrived.view;
    here_claim = std::move(arrived.claim);
  }
}

// to = from in to's element type (widened, or rounded back). A named function: nvcc takes no device
// lambda inside a lambda.
template <class Exec, class From, class To>
void convert_into(const From& from, const To& to) {
  using A = typename To::value_type;
  kernels::parallel_for(
      "meshtensor::ring_reduce_scattered_convert", kernels::range<Exec>(0, static_cast<std::int64_t>(from.extent(0))),
      KOKKOS_LAMBDA(std::int64_t e) { to(e) = static_cast<A>(from(e)); });
}

// to += from, in to's element type. A named function, not a lambda in ring_reduce_scattered: nvcc
// takes no device lambda in a function whose template arguments name a local type (the addend).
template <class Exec, class From, class To>
void add_into(const From& from, const To& to) {
  using A = typename To::value_type;
  kernels::parallel_for(
      "meshtensor::ring_reduce_scattered_add", kernels::range<Exec>(0, static_cast<std::int64_t>(to.extent(0))),
      KOKKOS_LAMBDA(std::int64_t e) { to(e) += static_cast<A>(from(e)); });
}

// An addend of the wrong size would be summed out of bounds: a bug in the op that makes it, named.
template <Tensor R>
void check_addend_size(const R& addend, std::int64_t expected, int part) {
  if (addend.local_size() != expected)
    throw std::logic_error(cat("meshtensor: ring_reduce_scattered: the addend for part ", part, " (", R::type_name(), ") has ",
                               addend.local_size(), " elements here, the part's sum ", expected));
}

// The sum over the ring's processors of their addends for this processor's part: addend(p) gives
// this processor's addend for part p's positions along D (a tensor of D's extent ring.extent[p],
// laid out alike on every processor of the ring), summed around the ring in float for bf16, in
// its own type otherwise: part p's sum starts on part p + 1's processor and ends, after P - 1
// hops, on part p's. The result is Out (extents ext, D split over ring.axes): this part's sum.
template <Dim D, Tensor Out, class Addend>
Out ring_reduce_scattered(const typename Out::mesh_type& m, const typename Out::extents_type& ext,
                          const ring_parts& ring, Addend&& addend) {
  using Exec = typename Out::execution_space;
  using Mem = typename Exec::memory_space;
  using T = typename Out::value_type;
  using A = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
  using view = Kokkos::View<A*, Mem>;
  communicator& comm = m.communicator();
  // Elements per position along D, in every addend and in the result.
  const auto local = placement<Out::rank>(Out::splits, comm.shape(), ext).local_extents(comm.coords());
  std::int64_t per_position = 1;
  for (std::size_t d = 0; d < Out::rank; ++d)
    if (d != Out::template index_of<D>()) per_position *= local[d];
  // An addend's elements in A: its own View where A is its type, else widened into a pool buffer.
  std::shared_ptr<void> widened_claim;
  const auto in_sum_type = [&](const auto& t) -> view {
    if constexpr (std::is_same_v<A, T>) {
      return t.view();
    } else {
      const view to = view_pool<A, Mem>::get().allocate(t.view().extent(0));
      widened_claim = planned_claim(to);
      convert_into<Exec>(t.view(), to);
      return to;
    }
  };
  int p = ring.part(1);  // the first addend's part: the one whose sum travels furthest
  view sum = [&] {
    const auto first = addend(p);
    check_addend_size(first, per_position * ring.extent[static_cast<std::size_t>(p)], p);
    return in_sum_type(first);
  }();
  std::shared_ptr<void> sum_claim = std::move(widened_claim);
  for (int step = 1; step < ring.parts; ++step) {
    const int next = ring.part(step + 1);
    const std::int64_t send_n = static_cast<std::int64_t>(sum.extent(0));
    const std::int64_t recv_n = per_position * ring.extent[static_cast<std::size_t>(next)];
    std::optional<std::invoke_result_t<Addend&, int>> mine;
    auto hop = ring_hop<Exec>(comm, ring.axes, ring.to, ring.from, sum, send_n, recv_n, true,
                              [&] { mine.emplace(addend(next)); });
    const view arrived = hop.view;
    check_addend_size(*mine, recv_n, next);
    add_into<Exec>(mine->view(), arrived);
    sum = arrived;
    sum_claim = std::move(hop.claim);
    p = next;
  }
  if constexpr (std::is_same_v<A, T>) {
    return Out(m, ext, sum);
  } else {
    Out out(m, ext, uninitialized);
    convert_into<Exec>(sum, out.view());
    return out;
  }
}

}  // namespace meshtensor::detail
