#pragma once
// cumsum<D>(x): the inclusive running sum of x along D.
// Communication: none when D is not split. When it is, each processor scans its slice and adds the
// sum of the slices of the parts before it: one exscan of the slice totals over D's axes when the
// layout rule names D's axes in mesh order (then sub-communicator rank order is part order), else
// one allgather of the slice totals over D's axes. The gradient (a reverse running sum) always
// takes the allgather route.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <vector>

#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace detail {

// Non-recording kernel: running sum along D, from the front or (reverse) from the back.
template <Dim D, Tensor X>
X cumsum_impl(const X& x, bool reverse) {
  const collective_subject subject(&X::type_name);
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  using L = typename X::layout_type;
  constexpr auto s = L::template split_of<D>();
  X out(x.mesh(), x.extents(), uninitialized);  // cumsum_local writes every element
  const auto src = local_along<D>(x);
  auto ov = out.view();
  const std::int64_t rows = src.outer * src.inner, n = src.n, inner = src.inner;
  kernels::parallel_for(
      "meshtensor::cumsum_local", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t o = r / inner, i = r % inner;
        T acc = 0;
        for (std::int64_t k = 0; k < n; ++k) {
          const std::int64_t l = reverse ? n - 1 - k : k;
          acc += src.v(src.at(o, l, i));
          ov(src.at(o, l, i)) = acc;
        }
      });
  if constexpr (s.count > 0) {
    // Slice totals per row: the last element of the running sum.
    const auto totals = detail::view_pool<T, typename X::memory_space>::get().allocate(static_cast<std::size_t>(rows));
    kernels::parallel_for(
        "meshtensor::cumsum_totals", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t r) {
          totals(r) = n == 0 ? T(0) : ov(src.at(r / inner, reverse ? 0 : n - 1, r % inner));
        });
    // The totals are few (one per row) and the host adds them up: a host copy.
    auto ht = host_copy<Exec>(totals);
    const auto before = detail::host_table<T>(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) before(r) = T(0);  // exscan leaves the first part's, and parts add up
    auto& comm = x.mesh().communicator();
    if (!reverse && s.in_mesh_order()) {
      exscan(comm, s.mask(), ht.data(), before.data(), rows);
    } else {
      const auto parts = parts_by_subrank(s, comm.shape(), comm.coords());
      const auto mine = s.part_at(comm.shape().sizes(), comm.coords());
      std::vector<T> all(parts.size() * static_cast<std::size_t>(rows));
      allgather(comm, s.mask(), ht.data(), rows, all.data());
      for (std::size_t q = 0; q < parts.size(); ++q)
        if (reverse ? parts[q] > mine : parts[q] < mine)
          for (std::int64_t r = 0; r < rows; ++r) before(r) += all[q * rows + r];
    }
    auto add = kernels::copy_to(typename X::memory_space{}, before);
    kernels::parallel_for(
        "meshtensor::cumsum_offset", kernels::range<Exec>(0, out.local_size()), KOKKOS_LAMBDA(std::int64_t idx) {
          ov(idx) += add((idx / (n * inner)) * inner + idx % inner);
        });
  }
  return out;
}

}  // namespace detail

// exscan over D's axes when its rule lists them in mesh order, else allgather; none when not split.
template <Tensor X, Dim D>
constexpr comm_plan cumsum_plan() {
  using L = typename X::layout_type;
  constexpr auto s = L::template split_of<D>();
  return comm_plan{}.then(s.in_mesh_order() ? collective::exscan : collective::allgather, s.mask());
}

// Gradient: the reverse running sum of the gradient.
template <Dim D, Tensor X>
X cumsum(const X& x) {
  detail::require_contiguous_along<"cumsum", D, X>();
  const detail::op_call call(detail::planned_op{"cumsum", cumsum_plan<X, D>()}, x);
  X out = detail::cumsum_impl<D>(x, false);
  detail::record<X>(out, [x = detail::node_only(x)](const X& g) { detail::push_grad(x, detail::cumsum_impl<D>(g, true)); }, x);
  return out;
}

}  // namespace meshtensor
