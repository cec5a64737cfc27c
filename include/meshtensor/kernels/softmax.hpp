#pragma once
// kernels::softmax_rows: softmax or log_softmax of each row of a [rows, n] contiguous array, for the
// fused softmax cross-entropy (nn/cross_entropy.hpp).
//   provider: oneDNN on host spaces for float (kernels/dnnl.hpp), when built with it and not turned
//   off (MESHTENSOR_KERNELS=portable); elsewhere has_softmax_rows is false and the op keeps its own
//   row kernels (kernels/rows.hpp), whose exponentials are libm's, one call per element.
// While planning nothing runs; the kernel is counted.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "../error.hpp"
#include "dnnl.hpp"
#include "launch.hpp"

namespace meshtensor::kernels {

// Whether a provider computes row softmaxes of T on Exec in this build and run.
template <class Exec, class T>
bool has_softmax_rows() {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  if constexpr (host && std::is_same_v<T, float>) {
#if MESHTENSOR_HAVE_DNNL
    return dnnl_provider::enabled();
#endif
  }
  return false;
}

// dst[r, :] = softmax(src[r, :]), or log_softmax with log; has_softmax_rows<Exec, T>() must hold.
template <class Exec, class T>
void softmax_rows(std::int64_t rows, std::int64_t n, bool log, const T* src, T* dst) {
  if (planned_away()) return;
  if (rows == 0 || n == 0) return;
#if MESHTENSOR_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) {
    Exec().fence();  // oneDNN runs on its own threads: Kokkos's writes to src come first
    dnnl_provider::softmax(rows, n, log, src, dst);
    return;
  }
#endif
  throw meshtensor::error("meshtensor: kernels::softmax_rows has no provider here (check has_softmax_rows first)");
}

}  // namespace meshtensor::kernels
