#pragma once
// allreduce_slice: a tensor's local slice summed (or maxed, or minned) over mesh axes, in place.
// Beside the tensor, below the tape (autodiff/tape.hpp reduces partial gradients with it) and the
// ops (reduce.hpp), which sit above the tape.
#include "../runtime/collectives.hpp"
#include "../runtime/nan_allreduce.hpp"
#include "mpi_buffer.hpp"
#include "tensor.hpp"

namespace meshtensor::detail {

// Allreduce of a local slice over the given axes, in place. Max and min propagate NaN (not
// MPI_MAX / MPI_MIN, whose NaN handling is implementation-defined) with a reduction function that
// runs on the host, so their buffer is host memory even with a device-aware MPI. Per (space,
// element type), not per tensor type (compile time).
template <class Exec, class T>
void allreduce_slice(communicator& comm, const Kokkos::View<T*, typename Exec::memory_space>& v, axis_set axes,
                     reduce_op op) {
  if (axes == 0) return;
  using buffer = mpi_buffer<Exec, T>;
  const auto b = buffer::reading(v, op == reduce_op::sum ? mpi_use::transfer : mpi_use::host_access);
  nan_propagating_allreduce(comm, axes, b.data(), static_cast<std::int64_t>(v.extent(0)), op);
  b.copy_into(v);
}

// The same for a tensor's local slice.
template <Tensor TT>
void allreduce_slice(TT& t, axis_set axes, reduce_op op) {
  const collective_subject subject(&TT::type_name);
  allreduce_slice<typename TT::execution_space, typename TT::value_type>(t.mesh().communicator(), t.view(), axes, op);
}

}  // namespace meshtensor::detail
