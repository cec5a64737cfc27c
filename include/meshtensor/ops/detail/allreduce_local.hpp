#pragma once
// allreduce_local: a tensor's local slice summed (or maxed, or minned) over mesh axes, in place.
// Its own header because the tape (autodiff/tape.hpp) reduces partial gradients with it, and the
// ops' headers include the tape.
#include "../../runtime/collectives.hpp"
#include "../../runtime/nan_ops.hpp"
#include "../../tensor/mpi_buffer.hpp"
#include "../../tensor/tensor.hpp"

namespace meshtensor::detail {

// Allreduce of a tensor's local slice over the given axes, in place. Max and min propagate NaN
// (not MPI_MAX / MPI_MIN, whose NaN handling is implementation-defined) with a reduction function
// that runs on the host, so their buffer is host memory even with a device-aware MPI.
template <Tensor TT>
void allreduce_local(TT& t, unsigned axes, reduce_op op) {
  if (axes == 0) return;
  using buffer = mpi_buffer<typename TT::execution_space, typename TT::value_type>;
  const auto b = buffer::reading(t.view(), op == reduce_op::sum ? mpi_use::transfer : mpi_use::host_access);
  nan_propagating_allreduce(t.mesh().communicator(), axes, b.data(), t.local_size(), op);
  b.copy_into(t.view());
}

}  // namespace meshtensor::detail
