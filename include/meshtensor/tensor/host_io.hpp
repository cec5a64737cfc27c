#pragma once
// Between a distributed tensor and a full row-major host array.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <span>
#include <vector>

#include "../runtime/agreement.hpp"
#include "../runtime/collectives.hpp"
#include "tensor.hpp"

namespace meshtensor {

namespace detail {
// Calls f(local_flat, global_flat) over a box of a tensor of global extents gext.
template <std::size_t R, class F>
void for_each_in_box(const box<R>& b, const std::array<std::int64_t, R>& gext, F&& f) {
  const auto gstride = row_major_strides<R>(gext);
  const std::int64_t n = b.size();
  for (std::int64_t l = 0; l < n; ++l) {
    std::int64_t rest = l, g = 0;
    for (std::size_t i = R; i-- > 0;) {
      g += (b.offset[i] + rest % b.extent[i]) * gstride[i];
      rest /= b.extent[i];
    }
    f(l, g);
  }
}

// Elements per mesh rank and where each rank's slice starts in a rank-ordered buffer.
template <Tensor TT>
std::pair<std::vector<int>, std::vector<int>> slice_counts(const TT& t) {
  const int nprocs = t.mesh().nprocs();
  std::vector<int> counts(nprocs), displs(nprocs);
  for (int r = 0, at = 0; r < nprocs; ++r) {
    counts[r] = checked_count(t.slice_of(r).size());
    displs[r] = at;
    at += counts[r];
  }
  return {std::move(counts), std::move(displs)};
}

inline unsigned all_axes(const communicator& c) {
  const auto n = c.sizes().size();
  return n >= 32 ? ~0u : (1u << n) - 1u;
}

template <Tensor TT>
void check_full_size(const TT& t, std::size_t n, const char* what) {
  if (static_cast<std::int64_t>(n) != t.size())
    throw shape_error(cat(what, ": the host array has ", n, " elements, but ", TT::type_name(), t.shape_string(),
                          " has ", t.size()));
}
}  // namespace detail

// Every processor passes the same full array; each keeps its slice.
template <Tensor TT>
TT from_host(const typename TT::mesh_type& m, const typename TT::extents_type& extents,
             std::span<const typename TT::value_type> full) {
  TT t(m, extents);
  // Each rank checks its own array; agreed, so that a wrong size on one rank throws on all of them.
  std::string wrong_size;
  try {
    detail::check_full_size(t, full.size(), "from_host");
  } catch (const shape_error& e) {
    wrong_size = e.what();
  }
  detail::agree_or_throw(m.communicator().cart(), wrong_size.empty(), wrong_size);
  auto host = Kokkos::create_mirror_view(t.view());
  detail::for_each_in_box(t.slice_of(m.rank()), t.extents(), [&](std::int64_t l, std::int64_t g) { host(l) = full[g]; });
  Kokkos::deep_copy(t.view(), host);
  return t;
}

// The root passes the full array (other ranks may pass an empty span); each processor receives
// only its slice. The size check uses the root's size, broadcast first, so all ranks agree.
template <Tensor TT>
TT scatter(const typename TT::mesh_type& m, const typename TT::extents_type& extents,
           std::span<const typename TT::value_type> full_on_root, int root = 0) {
  using T = typename TT::value_type;
  TT t(m, extents);
  auto& comm = m.communicator();
  std::int64_t root_size = static_cast<std::int64_t>(full_on_root.size());
  MPI_Bcast(&root_size, 1, MPI_INT64_T, root, comm.cart());
  detail::check_full_size(t, static_cast<std::size_t>(root_size), "scatter");
  const int nprocs = comm.nprocs();
  std::vector<T> packed;
  const auto [counts, displs] = detail::slice_counts(t);
  if (comm.rank() == root) {
    packed.resize(static_cast<std::size_t>(displs.back() + counts.back()));
    for (int r = 0; r < nprocs; ++r)
      detail::for_each_in_box(t.slice_of(r), t.extents(),
                              [&](std::int64_t l, std::int64_t g) { packed[displs[r] + l] = full_on_root[g]; });
  }
  auto host = Kokkos::create_mirror_view(t.view());
  comm.count(collective::gather, detail::all_axes(comm), t.local_size() * sizeof(T));
  MPI_Scatterv(packed.data(), counts.data(), displs.data(), detail::mpi_type<T>(), host.data(),
               detail::checked_count(t.local_size()), detail::mpi_type<T>(), root, comm.cart());
  Kokkos::deep_copy(t.view(), host);
  return t;
}

// The full tensor on every processor (row-major over the tensor's dims).
template <Tensor TT>
std::vector<typename TT::value_type> gather_all(const TT& t) {
  using T = typename TT::value_type;
  auto& comm = t.mesh().communicator();
  const int nprocs = comm.nprocs();
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, t.view());
  const auto [counts, displs] = detail::slice_counts(t);
  std::vector<T> all(static_cast<std::size_t>(displs.back() + counts.back()));
  comm.count(collective::gather, detail::all_axes(comm), t.local_size() * sizeof(T));
  MPI_Allgatherv(host.data(), detail::checked_count(t.local_size()), detail::mpi_type<T>(), all.data(), counts.data(),
                 displs.data(), detail::mpi_type<T>(), comm.cart());
  std::vector<T> full(static_cast<std::size_t>(t.size()));
  for (int r = 0; r < nprocs; ++r)
    detail::for_each_in_box(t.slice_of(r), t.extents(), [&](std::int64_t l, std::int64_t g) { full[g] = all[displs[r] + l]; });
  return full;
}

// The full tensor on the root; other processors get an empty vector.
template <Tensor TT>
std::vector<typename TT::value_type> gather(const TT& t, int root = 0) {
  using T = typename TT::value_type;
  auto& comm = t.mesh().communicator();
  const int nprocs = comm.nprocs();
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, t.view());
  const auto [counts, displs] = detail::slice_counts(t);
  const bool is_root = comm.rank() == root;
  std::vector<T> all(is_root ? static_cast<std::size_t>(displs.back() + counts.back()) : 0);
  comm.count(collective::gather, detail::all_axes(comm), t.local_size() * sizeof(T));
  MPI_Gatherv(host.data(), detail::checked_count(t.local_size()), detail::mpi_type<T>(), all.data(), counts.data(),
              displs.data(), detail::mpi_type<T>(), root, comm.cart());
  std::vector<T> full;
  if (is_root) {
    full.resize(static_cast<std::size_t>(t.size()));
    for (int r = 0; r < nprocs; ++r)
      detail::for_each_in_box(t.slice_of(r), t.extents(),
                              [&](std::int64_t l, std::int64_t g) { full[g] = all[displs[r] + l]; });
  }
  return full;
}

}  // namespace meshtensor
