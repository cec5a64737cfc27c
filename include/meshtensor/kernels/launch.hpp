#pragma once
// The one door for local work (docs/design.md, "Kernels"). Ops say what to compute on their slice;
// every launch goes through these entry points, which skip the work in one place while a planned
// mesh exists (the plan counts the launch instead) and otherwise hand it to the provider:
//   kernels::parallel_for / parallel_reduce   maps, row kernels, reductions (Kokkos, any space)
//   kernels::deep_copy                        copies and fills (Kokkos)
//   kernels::product (kernels/product.hpp)    batched matrix products (oneDNN, OpenBLAS, cuBLAS, Kokkos)
//   kernels::convolution (kernels/convolution.hpp)  direct convolutions (oneDNN; else none: the op
//                                             takes its portable unfold + product path)
// The entry points mirror Kokkos's names and arguments, so that an op's kernel reads as it would
// with Kokkos alone.
#include <Kokkos_Core.hpp>
#include <utility>

#include "../plan/ledger.hpp"

namespace meshtensor::kernels {

// True (skip the work) while planning, after counting one kernel in the plan.
inline bool planned_away() {
  if (!detail::planning()) return false;
  detail::plan_ledger::get().add_kernel();
  return true;
}

template <class... Args>
void parallel_for(Args&&... args) {
  if (!planned_away()) Kokkos::parallel_for(std::forward<Args>(args)...);
}

template <class... Args>
void parallel_reduce(Args&&... args) {
  if (!planned_away()) Kokkos::parallel_reduce(std::forward<Args>(args)...);
}

// A copy between views, or a fill with a value (Kokkos::deep_copy's overloads, with or without an
// execution space instance first).
template <class... Args>
void deep_copy(Args&&... args) {
  if (!planned_away()) Kokkos::deep_copy(std::forward<Args>(args)...);
}

}  // namespace meshtensor::kernels
