#pragma once
// The one door for local work (docs/design/devices.md, "Kernels"). Ops say what to compute on
// their slice; every launch goes through these entry points, which skip the work in one place while
// a planned mesh exists (the plan counts the launch instead) and otherwise hand it to the provider:
//   kernels::parallel_for / parallel_reduce   maps, row kernels, reductions (Kokkos, any space)
//   kernels::deep_copy                        copies and fills (Kokkos)
//   kernels::host_mirror / copy_to / fence    staging between memory spaces, and waiting for a
//                                             space's work (Kokkos)
//   kernels::product (kernels/product.hpp)    batched matrix products (oneDNN, OpenBLAS, cuBLAS, Kokkos)
//   kernels::convolution (kernels/convolution.hpp)  direct convolutions (oneDNN; else none: the op
//                                             takes its portable unfold + product path)
// The entry points mirror Kokkos's names and arguments, so that an op's kernel reads as it would
// with Kokkos alone.
// All of it runs on one execution space instance (kernels/instance.hpp): policies come from
// kernels::range and kernels::policy, and fence waits for that instance.
#include <Kokkos_Core.hpp>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "../plan/ledger.hpp"
#include "instance.hpp"
#include "pool.hpp"

namespace meshtensor::detail {
// The host's waits for an execution space's work in this process (kernels::fence).
inline std::atomic<std::int64_t>& host_wait_count() {
  static std::atomic<std::int64_t> count{0};
  return count;
}
}  // namespace meshtensor::detail

namespace meshtensor::kernels {

// The multiply-adds of one batched product, as the plan counts them; bf16 operands run at a rate of
// their own on GPUs and on CPUs with AVX512_BF16 or AMX (plan/cost_model.hpp).
struct planned_product {
  std::int64_t batch, rows, columns, contracted;
  bool bf16_operands = false;
};

// True (skip the work) while planning, after counting one kernel in the plan and the products it
// stands for. Every entry of the door, and each provider's (kernels/product.hpp, convolution.hpp,
// softmax.hpp), asks it first: the plan-mode skip is written here only.
inline bool planned_away(std::initializer_list<planned_product> products = {}) {
  if (!detail::planning()) return false;
  auto& ledger = detail::plan_ledger::get();
  for (const planned_product& p : products) ledger.add_product(p.batch, p.rows, p.columns, p.contracted, p.bf16_operands);
  ledger.add_kernel();
  return true;
}

// The bytes of a kernel's functor, with its policy, below which CUDA takes it as a kernel argument
// under the light-weight hint (Kokkos 3.4's KernelArgumentLimit, 4 KiB; the policy's own bytes
// are the margin).
inline constexpr std::size_t light_weight_functor_bytes = 3584;

// A policy with Kokkos's light-weight launch hint where the functor is small: on CUDA, Kokkos 3.4
// launches a functor of 512 bytes or more through constant memory, and such a launch waits for the
// previous one (kokkos/kokkos PR #3151: 4 us per launch, growing to 11-13); with the hint a functor
// under 4 KiB goes as a kernel argument, with no wait. Host backends ignore the hint.
template <class Functor, class Policy>
auto light_weight(const Policy& policy) {
  if constexpr (Kokkos::is_execution_policy<Policy>::value && sizeof(Functor) < light_weight_functor_bytes)
    return Kokkos::Experimental::require(policy, Kokkos::Experimental::WorkItemProperty::HintLightWeight);
  else
    return policy;
}

// True for (destination view, source view or value) where neither is memory the host can read.
template <class Dst, class Src>
constexpr bool device_only_copy_on_instance() {
  if constexpr (!Kokkos::is_view<Dst>::value) return false;  // an instance first: the caller's choice
  else if constexpr (Kokkos::is_view<Src>::value) return device_only_copy_v<Dst, Src>;
  else return device_only_copy_v<Dst>;
}

template <class Policy, class Functor>
void parallel_for(const std::string& name, const Policy& policy, const Functor& f) {
  if (planned_away()) return;
  if constexpr (std::is_integral_v<Policy>)  // a count, as Kokkos takes it: the default space's range
    Kokkos::parallel_for(name, light_weight<Functor>(range<Kokkos::DefaultExecutionSpace>(Policy{0}, policy)), f);
  else
    Kokkos::parallel_for(name, light_weight<Functor>(policy), f);
}

template <class... Args>
void parallel_reduce(Args&&... args) {
  if (!planned_away()) Kokkos::parallel_reduce(std::forward<Args>(args)...);
}

// A copy between views, or a fill with a value (Kokkos::deep_copy's overloads, with or without an
// execution space instance first). Without an instance, a copy or fill that stays in device memory
// is queued on the library's instance and the host goes on; one that the host's memory takes part
// in is Kokkos's, which waits for the device before and after (the host reads or writes the data).
template <class... Args>
void deep_copy(Args&&... args) {
  if (planned_away()) return;
  if constexpr (sizeof...(Args) == 2) {
    if constexpr (device_only_copy_on_instance<std::remove_cvref_t<Args>...>()) {
      using dst = std::remove_cvref_t<std::tuple_element_t<0, std::tuple<Args...>>>;
      Kokkos::deep_copy(instance<typename dst::execution_space>(), std::forward<Args>(args)...);
      return;
    }
  }
  Kokkos::deep_copy(std::forward<Args>(args)...);
}

// Waits for the work launched on an execution space instance: before the host reads or writes
// memory that kernels use, or hands it to MPI. The one place where a step waits for a device
// (docs/design/devices.md), so it is counted: in a plan instead of waiting (plan_report::waits),
// and in a run (meshtensor::host_waits()), so that a step's waits can be checked against its
// plan as its collectives are. (oneDNN's hand-offs fence host spaces, where kernels have already
// finished when they return: not counted.)
// Whichever instance of Exec is given, the library's is waited for: the one its work runs on.
template <class Exec>
void fence(const Exec&) {
  if (meshtensor::detail::planning()) {
    meshtensor::detail::plan_ledger::get().add_wait();
    return;
  }
  ++meshtensor::detail::host_wait_count();
  instance<Exec>().fence();
}

// A host view of v's shape (v itself where v is host memory); nothing is copied. Not skipped while
// planning: it allocates (a planned tensor's view is small: a plan does not hold the data).
// Where a copy is needed (device memory), a rank-1 mirror comes from the caching allocator
// (kernels/pool.hpp): a step that reads its loss or writes its batch allocates nothing.
template <class View>
auto host_mirror(const View& v) {
  using mirror = decltype(Kokkos::create_mirror_view(v));
  if constexpr (View::rank == 1 && !std::is_same_v<typename mirror::memory_space, typename View::memory_space>) {
    if (!detail::planning())
      return mirror(detail::view_pool<typename View::non_const_value_type, typename mirror::memory_space>::get().allocate(
          v.extent(0)));
  }
  return Kokkos::create_mirror_view(v);
}

// v's contents in memory space `space` (v itself where it is there already). Not skipped while
// planning: ops copy small host tables this way (offsets, counts) that the planned run reads.
// Where a copy is needed, a rank-1 one comes from the caching allocator, as host_mirror's.
template <class Space, class View>
auto copy_to(const Space& space, const View& v) {
  using copy = decltype(Kokkos::create_mirror_view_and_copy(space, v));
  if constexpr (View::rank == 1 && !std::is_same_v<typename copy::memory_space, typename View::memory_space>) {
    if (!detail::planning()) {
      copy c(detail::view_pool<typename View::non_const_value_type, typename copy::memory_space>::get().allocate(
          v.extent(0)));
      Kokkos::deep_copy(c, v);
      return c;
    }
  }
  return Kokkos::create_mirror_view_and_copy(space, v);
}

}  // namespace meshtensor::kernels

namespace meshtensor {
// The times this process's host has waited for an execution space's work (kernels::fence: before
// MPI reads or writes a buffer, before the host reads or writes a tensor's memory). A step's
// count is what its plan's report counts (plan_report::waits); on a GPU each is a stream
// synchronisation, the host idle until the device catches up.
inline std::int64_t host_waits() { return detail::host_wait_count().load(); }
}  // namespace meshtensor
