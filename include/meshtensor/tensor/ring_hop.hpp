#pragma once
// One hop of a ring with the buffers it needs: what is sent, staged for MPI when the send is posted,
// and what arrives, received into a fresh buffer whose planned claim keeps it counted in a plan for
// as long as the caller holds it. ring_exchange (runtime/collectives.hpp) does the transfer around
// the caller's work. Used by the rings that pass parts from processor to processor while they
// compute: ring attention's two passes (nn/ring_attention.hpp) and the tensor-parallel products'
// gather and sum (ops/detail/ring_passes.hpp).
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "../geometry/axis_set.hpp"
#include "../kernels/pool.hpp"
#include "../runtime/collectives.hpp"
#include "mpi_buffer.hpp"

namespace meshtensor::detail {

// What a hop brought: the part that arrived and, in a plan, the claim that counts its bytes.
template <class Exec, class T>
struct ring_arrival {
  Kokkos::View<T*, typename Exec::memory_space> view;
  std::shared_ptr<void> claim;
};

// Sends send_n elements of `send` to sub-rank `to` of the axes and receives recv_n from `from`
// while compute() runs (the send posted before it when send_first, after it otherwise: a buffer
// that compute() still writes). `send` is staged when the send is posted.
template <class Exec, class T, class Compute>
ring_arrival<Exec, T> ring_hop(communicator& comm, axis_set axes, int to, int from,
                               const Kokkos::View<T*, typename Exec::memory_space>& send, std::int64_t send_n,
                               std::int64_t recv_n, bool send_first, Compute&& compute) {
  using buffer = mpi_buffer<Exec, T>;
  std::optional<buffer> sent;
  const buffer received = buffer::writing(static_cast<std::size_t>(recv_n));
  auto claim = planned_claim_of_buffer(received);
  ring_exchange<T>(
      comm, axes,
      [&] {
        sent.emplace(buffer::reading(send));
        return static_cast<const T*>(sent->data());
      },
      send_n, to, received.data(), recv_n, from, send_first, std::forward<Compute>(compute));
  return {received.view(), std::move(claim)};
}

}  // namespace meshtensor::detail
