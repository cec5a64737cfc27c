#pragma once
// The execution space instance that all of the library's local work runs on, and the policies made
// on it (docs/design/devices.md, "One stream"). On a CUDA Kokkos it is a Kokkos::Cuda made from a
// stream of the library's own: Kokkos's kernels, cuBLAS's products and the copies between device
// buffers are queued there in order, and the host waits on that stream alone (kernels::fence), not
// on the whole device. Host spaces have one instance: their default.
#include <Kokkos_Core.hpp>

#include <type_traits>
#include <utility>

#include "../error.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
namespace meshtensor::detail {
// Made on first use (after Kokkos is initialized) and destroyed as Kokkos finalizes, before the
// CUDA context goes (a static would outlive it). The stream is a blocking one: what Kokkos itself
// queues on the legacy default stream (a View's zero fill, deep_copy without an instance) is
// ordered with the library's work without a wait; a non-blocking stream would race with it.
inline const Kokkos::Cuda& library_cuda_instance() {
  static const Kokkos::Cuda* const cuda = [] {
    cudaStream_t stream = nullptr;
    const cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamDefault);
    if (status != cudaSuccess)
      throw error(cat("meshtensor: cudaStreamCreateWithFlags failed for the library's stream: ",
                      cudaGetErrorString(status)));
    const auto* made = new Kokkos::Cuda(stream);
    Kokkos::push_finalize_hook([made, stream] {
      made->fence();
      delete made;
      cudaStreamDestroy(stream);
    });
    return made;
  }();
  return *cuda;
}
}  // namespace meshtensor::detail
#endif

namespace meshtensor::kernels {

// The instance of execution space Exec that the library's kernels, products and device copies run on.
template <class Exec>
const Exec& instance() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<Exec, Kokkos::Cuda>) return meshtensor::detail::library_cuda_instance();
  else
#endif
  {
    static const Exec exec{};
    return exec;
  }
}

// A policy of type Policy on the library's instance: Policy's own constructor arguments after the
// instance (a RangePolicy's begin and end, a TeamPolicy's league and team sizes, an MDRangePolicy's
// bounds and tiles). Every policy of the library is made here (the include checker refuses a
// policy constructed elsewhere), so no kernel lands on the default stream by accident.
template <class Policy, class... Args>
Policy policy(Args&&... args) {
  return Policy(instance<typename Policy::execution_space>(), std::forward<Args>(args)...);
}

// The common case: Kokkos::RangePolicy<Exec, Properties...> over [begin, end).
template <class Exec, class... Properties, class Begin, class End>
Kokkos::RangePolicy<Exec, Properties...> range(Begin begin, End end) {
  return Kokkos::RangePolicy<Exec, Properties...>(instance<Exec>(), begin, end);
}

// Whether a copy or fill into Dst (from Src) stays on the device: neither side is memory the host
// can read (pinned and managed memory can). Such a copy is queued on the library's instance and the
// host does not wait for it; a copy the host takes part in is Kokkos's blocking one.
template <class Dst, class Src = Dst>
inline constexpr bool device_only_copy_v =
    !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Dst::memory_space>::accessible &&
    !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Src::memory_space>::accessible;

#if defined(KOKKOS_ENABLE_CUDA)
// Checked where it matters, in every CUDA build: device memory only is queued; pinned and managed
// memory, which the host reads, are not.
static_assert(device_only_copy_v<Kokkos::View<float*, Kokkos::CudaSpace>>);
static_assert(!device_only_copy_v<Kokkos::View<float*, Kokkos::CudaHostPinnedSpace>>);
static_assert(!device_only_copy_v<Kokkos::View<float*, Kokkos::CudaUVMSpace>>);
static_assert(!device_only_copy_v<Kokkos::View<float*, Kokkos::CudaSpace>, Kokkos::View<float*, Kokkos::HostSpace>>);
#endif

}  // namespace meshtensor::kernels
