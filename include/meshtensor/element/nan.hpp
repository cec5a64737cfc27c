#pragma once
// NaN propagates (docs/concepts.md, "NaN"): a max or min over elements one of which is NaN is
// NaN, as in NumPy's and PyTorch's max, whichever element is NaN and however the elements are
// split over processors. nan_max / nan_min are that rule for two values, shared by every local
// kernel (reduce_to, the softmax and cross-entropy row kernels, elementwise maximum / minimum), and
// a Kokkos reducer for teams; runtime/nan_allreduce.hpp applies it across processors.
#include <Kokkos_Core.hpp>

#include "bf16.hpp"
#include "kokkos_math.hpp"

namespace meshtensor::detail {

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

}  // namespace meshtensor::detail
