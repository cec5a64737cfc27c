#pragma once
// take<D>(x, index): rows picked along D by a host index, out[.., r, ..] = x[.., index[r], ..] for
// r in [0, index.size()): D gets extent index.size(); indices may repeat or be left out. Beam
// search's reorder of its hypotheses' caches (each row continues some row of the step before)
// where the data lives, with no trip through the host.
// `index` must be the same on every processor (a host value, as slice's begin): each decides the
// path from it and the placement alone. That is checked on every call by one small allreduce (a
// hash of the index): a differing index would otherwise leave some processors in the allgather.
// Communication: none when D is not split, or when every processor's new rows come from rows it
// holds (the beams of a sentence kept on one processor: the usual case); otherwise one allgather
// of x over D's axes, after which each processor picks its rows. (A point-to-point exchange of the
// crossing rows only would move less; not built.)
// Gradient: scatter-add, out's rows added into the rows they came from (repeated indices add up):
// local on the first path; on the second, into a buffer of D's whole extent, allreduced over D's
// axes, of which each processor keeps its part.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "../plan/comm_plan.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"
#include "../tensor/allreduce_slice.hpp"

namespace meshtensor {

// ---- plans ------------------------------------------------------------------------------------
// Every processor's new rows among the rows it holds (or D not split): nothing.
template <Tensor X, Dim D>
constexpr comm_plan take_plan() {
  return {};
}
// Some processor's new rows held elsewhere: one allgather of x over D's axes.
template <Tensor X, Dim D>
constexpr comm_plan take_gathered_plan() {
  return comm_plan{}.then(collective::allgather, X::layout_type::template split_of<D>().mask());
}

namespace detail {

// The path, from the index and the placements (the same on every processor), read by the op's
// execution and by its plan.
template <Tensor X, Dim D>
struct take_op {
  const char* name;
  bool gathered;
  constexpr comm_plan plan() const { return gathered ? take_gathered_plan<X, D>() : take_plan<X, D>(); }
};

// Whether some processor's part of the result along D takes a row from another part of x.
template <Dim D, Tensor X>
bool take_crosses_parts(const X& x, const X& out, const std::vector<std::int64_t>& index) {
  if constexpr (X::layout_type::template split_of<D>().count == 0) {
    return false;
  } else {
    constexpr std::size_t d = X::template index_of<D>();
    const auto from = x.placement(), to = out.placement();
    for (std::size_t r = 0; r < index.size(); ++r)
      if (to.part_of(d, static_cast<std::int64_t>(r)) != from.part_of(d, index[r])) return true;
    return false;
  }
}

// This processor's rows of the result along D, as positions in src (index[r] - src.begin), in
// memory space Mem.
template <class Mem>
Kokkos::View<std::int64_t*, Mem> take_positions(const std::vector<std::int64_t>& index, std::int64_t first,
                                                std::int64_t count, std::int64_t src_begin) {
  const auto at = detail::host_table<std::int64_t>(static_cast<std::size_t>(count));
  for (std::int64_t l = 0; l < count; ++l) at(l) = index[static_cast<std::size_t>(first + l)] - src_begin;
  return kernels::copy_to(Mem{}, at);
}

// A row's inner run is copied by work items of at most this many elements: contiguous copies on a
// CPU, enough items for a GPU when rows are few and long (a key-value cache's).
inline constexpr std::int64_t take_chunk = 256;

// dst(o, l, i) = src(o, at(l), i) for dst's local rows l (forward), or src(o, at(l), i) += dst(o,
// l, i) (gradient: a scatter-add, one work item per (o, chunk) walking the rows in order, so
// repeated indices add up without atomics and in a fixed order).
template <class Exec, class View>
void take_rows(const along_view<View>& dst, const along_view<View>& src,
               const Kokkos::View<std::int64_t*, typename View::memory_space>& at, bool scatter_add) {
  const std::int64_t chunk = take_chunk, chunks = (dst.inner + chunk - 1) / chunk;  // captured: no host constant in a device lambda
  if (!scatter_add) {
    kernels::parallel_for(
        "meshtensor::take", kernels::range<Exec>(0, dst.outer * dst.n * chunks), KOKKOS_LAMBDA(std::int64_t item) {
          const std::int64_t o = item / (dst.n * chunks), l = (item / chunks) % dst.n, c = item % chunks;
          const std::int64_t lo = c * chunk, hi = lo + chunk < dst.inner ? lo + chunk : dst.inner;
          const std::int64_t from = src.at(o, at(l), 0), to = dst.at(o, l, 0);
          for (std::int64_t i = lo; i < hi; ++i) dst.v(to + i) = src.v(from + i);
        });
  } else {
    kernels::parallel_for(
        "meshtensor::take_grad", kernels::range<Exec>(0, dst.outer * chunks), KOKKOS_LAMBDA(std::int64_t item) {
          const std::int64_t o = item / chunks, c = item % chunks;
          const std::int64_t lo = c * chunk, hi = lo + chunk < dst.inner ? lo + chunk : dst.inner;
          for (std::int64_t l = 0; l < dst.n; ++l) {
            const std::int64_t from = dst.at(o, l, 0), to = src.at(o, at(l), 0);
            for (std::int64_t i = lo; i < hi; ++i) src.v(to + i) += dst.v(from + i);
          }
        });
  }
}

// The gradient: g's rows added into the rows of x (extents x_extents) they were taken from.
template <Dim D, Tensor X>
X take_grad(const X& g, const typename X::extents_type& x_extents, const std::vector<std::int64_t>& index, bool gathered) {
  using Exec = typename X::execution_space;
  using Mem = typename X::memory_space;
  using T = typename X::value_type;
  X dx(g.mesh(), x_extents);
  const auto rows = local_along<D>(g);
  auto into = local_along<D>(dx);
  if (!gathered) {
    take_rows<Exec>(rows, into, take_positions<Mem>(index, rows.begin, rows.n, into.begin), true);
    return dx;
  }
  // Every processor's rows land anywhere along D: a zero buffer of D's whole extent, summed over
  // D's axes, then each processor's own part.
  const std::int64_t n = dx.template extent<D>();
  along_view<typename X::view_type> full{
      detail::view_pool<T, Mem>::get().allocate(static_cast<std::size_t>(into.outer * n * into.inner)), into.outer, n,
      into.inner, 0};
  kernels::deep_copy(full.v, T{});  // rows are added into it
  take_rows<Exec>(rows, full, take_positions<Mem>(index, rows.begin, rows.n, 0), true);
  allreduce_slice<Exec, T>(dx.mesh().communicator(), full.v, X::layout_type::template split_of<D>().mask(), reduce_op::sum);
  place_along<D>(dx, full, 0);
  return dx;
}

}  // namespace detail

// ---- op ---------------------------------------------------------------------------------------
// Rows index[0], index[1], ... of x along D. Throws shape_error (on every processor alike, since
// the index is the same everywhere) for an index outside [0, extent of D).
template <Dim D, Tensor X>
X take(const X& x, const std::vector<std::int64_t>& index) {
  detail::require_contiguous_along<"take", D, X>();
  const std::int64_t n = x.template extent<D>();
  // Agreed first: the bounds check below is then alike on every rank.
  if (!x.mesh().communicator().planned()) {
    if (!detail::same_on_every_rank(x.mesh().communicator().cart(), index))
      throw shape_error(detail::cat("take: the index along dim '", D::name(), "' of ", X::type_name(),
                                    " differs between processors (", index.size(),
                                    " entries here); it must be the same host value on every one"));
  }
  for (std::size_t r = 0; r < index.size(); ++r)
    if (index[r] < 0 || index[r] >= n)
      throw shape_error(detail::cat("take: index[", r, "] = ", index[r], " is outside [0, ", n, "), the extent of dim '",
                                    D::name(), "' in ", X::type_name(), x.shape_string()));
  const auto m = static_cast<std::int64_t>(index.size());
  X out(x.mesh(), detail::with_extent<D>(x, m), uninitialized);  // every element is written below
  const detail::op_call call(detail::take_op<X, D>{"take", detail::take_crosses_parts<D>(x, out, index)}, x);
  const bool gathered = call.op().gathered;
  const auto dst = detail::local_along<D>(out);
  const auto src = gathered ? detail::full_along<D>(x) : detail::local_along<D>(x);
  detail::take_rows<typename X::execution_space>(dst, src, detail::take_positions<typename X::memory_space>(index, dst.begin, dst.n, src.begin),
                                                 false);
  detail::record<X>(
      out,
      [x = detail::node_only(x), extents = x.extents(), index, gathered](const X& g) {
        detail::push_fresh_grad(x, detail::take_grad<D>(g, extents, index, gathered));
      },
      x);
  return out;
}

}  // namespace meshtensor
