#pragma once
// NaN propagates across processors (docs/concepts.md, "NaN"): nan_propagating_allreduce applies
// element/nan.hpp's rule where MPI_MAX / MPI_MIN on a NaN are implementation-defined (Open MPI's
// keeps or drops it by the order of the operands).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "collectives.hpp"
#include "communicator.hpp"
#include "../element/nan.hpp"

namespace meshtensor {

namespace detail {

// MPI user function: inout[i] = nan_max(inout[i], in[i]) (or nan_min), elementwise.
template <class T, bool Max>
void nan_extremum_user_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  const int n = *len;
  for (int i = 0; i < n; ++i) b[i] = Max ? nan_max(b[i], a[i]) : nan_min(b[i], a[i]);
}

// The NaN-propagating MPI_Op for T and max or min, created on first use (after MPI_Init, since
// only collectives call it) and then reused. Deliberately leaked: MPI_Op_free must run before
// MPI_Finalize, which ~environment calls, but a static's destructor runs after it. At most four
// handles (float and double, max and min) live until the process ends, which releases them.
template <class T, bool Max>
MPI_Op nan_extremum_op() {
  static const MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&nan_extremum_user_fn<T, Max>, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

}  // namespace detail

// As allreduce, except that max and min of floating-point elements propagate NaN: an element is
// NaN on every processor when it is NaN on any. Sum needs nothing (NaN + x is NaN in IEEE
// arithmetic, and MPI_SUM adds), nor do integers.
//
// Why a user-defined MPI_Op: it is the cheapest correct choice. It sends the same one message of
// the same size as MPI_MAX, with no pass over the buffer outside MPI; the combining loop is ours
// (vectorisable) and is declared commutative, so MPI picks the same allreduce algorithms as for a
// built-in op. An extra flag would need a second allreduce (or a doubled buffer) per call;
// encoding floats as order-preserving integers with NaN mapped to the top (max) or bottom (min)
// would use MPI_MAX on integers, but adds two passes over the buffer and makes the NaN's payload
// a choice of the encoding.
template <class T>
void nan_propagating_allreduce(communicator& c, axis_set axes, T* data, std::int64_t n, reduce_op op) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (c.planned() || c.size_over(axes) == 1)
      return nan_propagating_allreduce(c, axes, static_cast<float*>(nullptr), n, op);
    auto wide = detail::widened(data, n);
    nan_propagating_allreduce(c, axes, wide.data(), n, op);
    return detail::narrow_into(wide, data);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (op == reduce_op::max || op == reduce_op::min) {
      // (the op is made on first use: never in a plan, which sends nothing)
      const MPI_Op mop = c.planned() ? MPI_OP_NULL
                         : op == reduce_op::max ? detail::nan_extremum_op<T, true>()
                                                : detail::nan_extremum_op<T, false>();
      return detail::allreduce_in_place(c, axes, data, n, mop);
    }
  }
  allreduce(c, axes, data, n, op);
}

}  // namespace meshtensor
