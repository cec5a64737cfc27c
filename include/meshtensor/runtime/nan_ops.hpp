#pragma once
// NaN propagates (docs/concepts.md, "NaN"): a max or min over elements one of which is NaN is
// NaN, as in NumPy's and PyTorch's max, whichever element is NaN and however the elements are
// split over processors. nan_max / nan_min are that rule for two values, shared by every local
// kernel (reduce_to, the softmax and cross-entropy row kernels, elementwise maximum / minimum);
// nan_propagating_allreduce applies it across processors, where MPI_MAX / MPI_MIN on a NaN are
// implementation-defined (Open MPI's keeps or drops it by the order of the operands).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "collectives.hpp"
#include "communicator.hpp"
#include "kokkos_math.hpp"

namespace meshtensor {

namespace detail {

// a if a is NaN or a >= b, else b: NaN if either is NaN (a if both are), the larger otherwise,
// ties to a. For integers `a != a` is false and folds away.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T nan_max(T a, T b) {
  return (a >= b || a != a) ? a : b;
}
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T nan_min(T a, T b) {
  return (a <= b || a != a) ? a : b;
}

// Kokkos's reducer concept for nan_max (Max) or nan_min, for a team's reduction (Kokkos::Max and
// Min drop a NaN by the order of the operands). Its identity is -inf (+inf) for floating types, so
// that a max over -inf elements is -inf; the lowest (highest) value for integers.
template <class T, bool Max>
struct nan_extremum_reducer {
  using reducer = nan_extremum_reducer;
  using value_type = T;
  using result_view_type = Kokkos::View<T, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;  // as Kokkos::Max's
  T& value;
  KOKKOS_INLINE_FUNCTION explicit nan_extremum_reducer(T& v) : value(v) {}
  KOKKOS_INLINE_FUNCTION static T combine(T a, T b) { return Max ? nan_max(a, b) : nan_min(a, b); }
  KOKKOS_INLINE_FUNCTION void join(T& dest, const T& src) const { dest = combine(dest, src); }
  KOKKOS_INLINE_FUNCTION void join(volatile T& dest, const volatile T& src) const {
    dest = combine(static_cast<T>(dest), static_cast<T>(src));
  }
  KOKKOS_INLINE_FUNCTION void init(T& v) const {
    if constexpr (is_real_v<T>)
      v = Max ? T(-kmath::infinity<T>()) : kmath::infinity<T>();
    else
      v = Max ? Kokkos::reduction_identity<T>::max() : Kokkos::reduction_identity<T>::min();
  }
  KOKKOS_INLINE_FUNCTION T& reference() const { return value; }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return result_view_type(&value); }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return true; }
};

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
void nan_propagating_allreduce(detail::communicator& c, unsigned axes, T* data, std::int64_t n, reduce_op op) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (c.planned() || c.size_over(axes) == 1)
      return nan_propagating_allreduce(c, axes, static_cast<float*>(nullptr), n, op);
    auto wide = detail::widened(data, n);
    nan_propagating_allreduce(c, axes, wide.data(), n, op);
    return detail::narrow_into(wide, data);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (op == reduce_op::max || op == reduce_op::min) {
      c.count(collective::allreduce, axes, n * static_cast<std::int64_t>(sizeof(T)));
      if (c.planned() || c.size_over(axes) == 1) return;
      const MPI_Op mop = op == reduce_op::max ? detail::nan_extremum_op<T, true>() : detail::nan_extremum_op<T, false>();
      detail::allreduce_in_place(c, axes, data, detail::checked_count(n), mop);
      return;
    }
  }
  allreduce(c, axes, data, n, op);
}

}  // namespace meshtensor
