#pragma once
// Between a distributed tensor and a full row-major host array.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "../geometry/exchange.hpp"
#include "../kernels/launch.hpp"
#include "../runtime/agreement.hpp"
#include "../runtime/collectives.hpp"
#include "mpi_buffer.hpp"
#include "tensor.hpp"

namespace meshtensor {

namespace detail {
// Calls f(at_in_full, at_in_local, n) for each run of a piece of a slice (placement's pieces_at;
// a contiguous slice is one piece) in a row-major array of global extents ext and in the local
// array, read through the piece's frame (geometry/box.hpp's runs_between).
template <std::size_t R, class F>
void for_each_piece_run(const piece<R>& pc, const std::array<std::int64_t, R>& ext, F&& f) {
  const std::array<std::int64_t, R> origin{};
  const auto runs = runs_between(pc.held.offset, pc.held.extent, origin, ext, pc.frame.offset, pc.frame.extent);
  for (std::int64_t k = 0; k < runs.count; ++k) {
    const auto [g, l] = runs.at(k);
    f(g, l, runs.length);
  }
}

// Every rank's slice, back to back in rank order, as pieces (a contiguous slice: one).
template <std::size_t R>
struct all_slices {
  exchange_blocks blocks;
  std::vector<std::vector<piece<R>>> pieces;  // by rank
  all_slices() = default;
  explicit all_slices(const placement<R>& p) {
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(p.nprocs()));
    pieces.resize(sizes.size());
    for (std::int64_t r = 0; r < p.nprocs(); ++r) {
      pieces[r] = p.pieces_of(r);
      sizes[r] = 1;
      for (auto e : pieces[r].empty() ? std::array<std::int64_t, R>{} : pieces[r].front().frame.extent) sizes[r] *= e;
    }
    blocks = exchange_blocks(sizes);
  }
};

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

// The host side of from_host, scatter, gather and gather_all, on (element type, rank) only: one
// instance serves every layout and dim list of that rank (compile time, docs/performance.md).
template <class T, std::size_t R>
void copy_box_from_full(const placement<R>& p, std::int64_t mesh_rank, std::span<const T> full, T* local) {
  for (const auto& pc : p.pieces_of(mesh_rank))
    for_each_piece_run(pc, p.extents(),
                       [&](std::int64_t g, std::int64_t l, std::int64_t n) { std::copy_n(full.data() + g, n, local + l); });
}

template <class T, std::size_t R>
void scatter_from_root(communicator& comm, const placement<R>& p, std::span<const T> full_on_root, int root,
                       T* local, std::int64_t local_size) {
  // Every rank's box, back to back in rank order (geometry/exchange.hpp).
  std::vector<T> packed;
  all_slices<R> slices;
  if (!comm.planned()) slices = all_slices<R>(p);
  const auto& counts = slices.blocks.counts;
  const auto& displs = slices.blocks.displs;
  if (!comm.planned() && comm.rank() == root) {
    packed.resize(static_cast<std::size_t>(slices.blocks.total));
    for (std::size_t r = 0; r < slices.pieces.size(); ++r)
      for (const auto& pc : slices.pieces[r])
        for_each_piece_run(pc, p.extents(), [&](std::int64_t g, std::int64_t l, std::int64_t n) {
          std::copy_n(full_on_root.data() + g, n, packed.data() + displs[r] + l);
        });
  }
  comm.run(
      {collective::gather, all_axes(comm), local_size * static_cast<std::int64_t>(sizeof(T))},
      [&] {
        MPI_Scatterv(packed.data(), counts.data(), displs.data(), mpi_type<T>(), local, checked_count(local_size),
                     mpi_type<T>(), root, comm.over(all_axes(comm)));
      },
      [&](MPI_Request* r) {
        MPI_Iscatterv(packed.data(), counts.data(), displs.data(), mpi_type<T>(), local, checked_count(local_size),
                      mpi_type<T>(), root, comm.over(all_axes(comm)), r);
      });
}

// The full row-major array on `root`, or on every processor when root < 0; empty elsewhere.
template <class T, std::size_t R>
std::vector<T> gather_slices(communicator& comm, const placement<R>& p, const T* local, std::int64_t local_size,
                             int root) {
  const bool here = root < 0 || comm.rank() == root;
  all_slices<R> slices;
  std::vector<T> all;
  if (!comm.planned()) {
    slices = all_slices<R>(p);
    all.resize(here ? static_cast<std::size_t>(slices.blocks.total) : 0);
  }
  const auto& counts = slices.blocks.counts;
  const auto& displs = slices.blocks.displs;
  const auto sub = [&] { return comm.over(all_axes(comm)); };
  const bool ran = comm.run(
      {collective::gather, all_axes(comm), local_size * static_cast<std::int64_t>(sizeof(T))},
      [&] {
        if (root < 0)
          MPI_Allgatherv(local, checked_count(local_size), mpi_type<T>(), all.data(), counts.data(), displs.data(),
                         mpi_type<T>(), sub());
        else
          MPI_Gatherv(local, checked_count(local_size), mpi_type<T>(), all.data(), counts.data(), displs.data(),
                      mpi_type<T>(), root, sub());
      },
      [&](MPI_Request* r) {
        if (root < 0)
          MPI_Iallgatherv(local, checked_count(local_size), mpi_type<T>(), all.data(), counts.data(), displs.data(),
                          mpi_type<T>(), sub(), r);
        else
          MPI_Igatherv(local, checked_count(local_size), mpi_type<T>(), all.data(), counts.data(), displs.data(),
                       mpi_type<T>(), root, sub(), r);
      });
  if (!ran) {  // a plan: no data, zeros of the full size where a real run returns the tensor
    std::int64_t size = 1;
    for (auto e : p.extents()) size *= e;
    return std::vector<T>(here ? static_cast<std::size_t>(size) : 0);
  }
  std::vector<T> full;
  if (here) {
    std::int64_t size = 1;
    for (auto e : p.extents()) size *= e;
    full.resize(static_cast<std::size_t>(size));
    for (std::size_t r = 0; r < slices.pieces.size(); ++r)
      for (const auto& pc : slices.pieces[r])
        for_each_piece_run(pc, p.extents(), [&](std::int64_t g, std::int64_t l, std::int64_t n) {
          std::copy_n(all.data() + displs[r] + l, n, full.data() + g);
        });
  }
  return full;
}
}  // namespace detail

// Every processor passes the same full array; each keeps its slice.
template <Tensor TT>
TT from_host(const typename TT::mesh_type& m, const typename TT::extents_type& extents,
             std::span<const typename TT::value_type> full) {
  TT t(m, extents, uninitialized);  // the host writes every element of the slice below
  // Each rank checks its own array; agreed, so that a wrong size on one rank throws on all of them.
  std::string wrong_size;
  try {
    detail::check_full_size(t, full.size(), "from_host");
  } catch (const shape_error& e) {
    wrong_size = e.what();
  }
  m.communicator().agree_or_throw(wrong_size.empty(), wrong_size);
  kernels::fence(typename TT::execution_space{});  // kernels that used the slice's reused block, before the host writes
  if (m.is_planned()) {  // the wait above counted, the copy's bytes too
    detail::plan_ledger::get().add_host_bytes(t.local_size() * static_cast<std::int64_t>(sizeof(typename TT::value_type)));
    return t;
  }
  auto host = kernels::host_mirror(t.view());
  detail::copy_box_from_full(t.placement(), m.rank(), full, host.data());
  kernels::deep_copy(t.view(), host);
  return t;
}

// The root passes the full array (other ranks may pass an empty span); each processor receives
// only its slice. The size check uses the root's size, broadcast first, so all ranks agree.
template <Tensor TT>
TT scatter(const typename TT::mesh_type& m, const typename TT::extents_type& extents,
           std::span<const typename TT::value_type> full_on_root, int root = 0) {
  TT t(m, extents, uninitialized);  // every element of the slice is received below
  auto& comm = m.communicator();
  std::int64_t root_size = static_cast<std::int64_t>(full_on_root.size());
  if (comm.planned()) {
    kernels::fence(typename TT::execution_space{});  // counted: the run waits before the host writes
    // The plan may stand for a processor other than the root, which passes an empty span.
    if (!full_on_root.empty()) detail::check_full_size(t, static_cast<std::size_t>(root_size), "scatter");
    detail::scatter_from_root(comm, t.placement(), full_on_root, root, static_cast<typename TT::value_type*>(nullptr),
                              t.local_size());
    return t;
  }
  MPI_Bcast(&root_size, 1, MPI_INT64_T, root, comm.cart());
  detail::check_full_size(t, static_cast<std::size_t>(root_size), "scatter");
  kernels::fence(typename TT::execution_space{});
  auto host = kernels::host_mirror(t.view());
  detail::scatter_from_root(comm, t.placement(), full_on_root, root, host.data(), t.local_size());
  kernels::deep_copy(t.view(), host);
  return t;
}

// The value of a rank-0 tensor (a loss, a norm), which every processor holds, on the host.
template <Tensor TT>
typename TT::value_type item(const TT& t) {
  static_assert(TT::rank == 0, "meshtensor: item() reads a rank-0 tensor; gather_all or gather read the others");
  return detail::host_copy<typename TT::execution_space>(t.view())(0);
}

// The full tensor on every processor (row-major over the tensor's dims).
template <Tensor TT>
std::vector<typename TT::value_type> gather_all(const TT& t) {
  const auto host = detail::host_copy<typename TT::execution_space>(t.view());
  return detail::gather_slices(t.mesh().communicator(), t.placement(), host.data(), t.local_size(), -1);
}

// The full tensor on the root; other processors get an empty vector.
template <Tensor TT>
std::vector<typename TT::value_type> gather(const TT& t, int root = 0) {
  const auto host = detail::host_copy<typename TT::execution_space>(t.view());
  return detail::gather_slices(t.mesh().communicator(), t.placement(), host.data(), t.local_size(), root);
}

}  // namespace meshtensor
