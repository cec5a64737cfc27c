#pragma once
// The memory MPI reads and writes for a tensor's data: the data's own where MPI can reach it
// (host memory; device memory when the MPI is device-aware), otherwise a pinned host buffer
// (CudaHostPinnedSpace under CUDA: one DMA each way, no bounce through pageable memory) taken from
// the tensor memory cache, so that a training step's collectives allocate nothing after the first.
// This is the one place where data leaves a device, so it is where kernels are waited for: the
// kernels themselves do not fence (on a GPU, kernels on one stream run in order without a wait).
//
// MESHTENSOR_MPI_BUFFERS chooses: automatic (default), staged (always a separate host buffer:
// the tests run the staging path on the CPU with it), direct (the data's own memory even on a
// device: for a device-aware MPI that the query below does not recognise).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>

#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_CUDA_AWARE_SUPPORT and MPIX_Query_cuda_support (after mpi.h)
#endif

#include "../error.hpp"
#include "../kernels/pool.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {
namespace detail {

enum class mpi_buffers { automatic, staged, direct };

inline mpi_buffers mpi_buffers_from_environment() {
  static const mpi_buffers choice = [] {
    const char* v = std::getenv("MESHTENSOR_MPI_BUFFERS");
    const std::string value = v ? v : "";
    if (value.empty() || value == "automatic") return mpi_buffers::automatic;
    if (value == "staged") return mpi_buffers::staged;
    if (value == "direct") return mpi_buffers::direct;
    throw error(cat("meshtensor: MESHTENSOR_MPI_BUFFERS is '", value, "'; expected automatic, staged or direct"));
  }();
  return choice;
}

// Whether this MPI accepts device pointers: Open MPI says so at compile and at run time (Debian's
// does not); other MPIs are assumed not to (MESHTENSOR_MPI_BUFFERS=direct overrides).
inline bool mpi_is_device_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  static const bool aware = MPIX_Query_cuda_support() == 1;
  return aware;
#else
  return false;
#endif
}

template <class Mem>
constexpr bool host_accessible = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;

#ifdef KOKKOS_ENABLE_CUDA
template <class Mem>
using staging_space = std::conditional_t<host_accessible<Mem>, Kokkos::HostSpace, Kokkos::CudaHostPinnedSpace>;
#else
template <class Mem>
using staging_space = Kokkos::HostSpace;
#endif

// Who touches the buffer's elements: MPI alone (transfers and built-in reductions, which a
// device-aware MPI runs on device memory), or also the host (a user-defined reduction function,
// as nan_propagating_allreduce's max and min; the zeros a non-wrapping shift writes at the edge).
enum class mpi_use { transfer, host_access };

template <class Exec, class T>
class mpi_buffer {
 public:
  using memory_space = typename Exec::memory_space;
  using view_type = Kokkos::View<T*, memory_space>;
  using staged_type = Kokkos::View<T*, staging_space<memory_space>>;

  // For MPI to read v's elements (and, through copy_into(v), to write them in place). Waits for
  // the kernels that wrote v.
  static mpi_buffer reading(const view_type& v, mpi_use use = mpi_use::transfer) {
    mpi_buffer b(use);
    kernels::fence(Exec{});
    if (b.direct_) {
      b.own_ = v;
    } else {
      b.staged_ = view_pool<T, staging_space<memory_space>>::get().allocate(v.extent(0));
      kernels::deep_copy(b.staged_, v);
    }
    return b;
  }

  // For MPI to write n elements, then read as a View of Exec's space (view(), copy_into). Waits
  // for running kernels: a cached buffer that MPI is about to write may be one they still read.
  static mpi_buffer writing(std::size_t n, mpi_use use = mpi_use::transfer) {
    mpi_buffer b(use);
    kernels::fence(Exec{});
    if (b.direct_) b.own_ = view_pool<T, memory_space>::get().allocate(n);
    else b.staged_ = view_pool<T, staging_space<memory_space>>::get().allocate(n);
    return b;
  }

  // For MPI to write v's elements: v itself where MPI can reach it, else a staging buffer that
  // copy_into(v) copies from. Waits for the kernels that use v.
  static mpi_buffer receiving_into(const view_type& v) {
    mpi_buffer b(mpi_use::transfer);
    kernels::fence(Exec{});
    if (b.direct_) b.own_ = v;
    else b.staged_ = view_pool<T, staging_space<memory_space>>::get().allocate(v.extent(0));
    return b;
  }

  T* data() const { return direct_ ? own_.data() : staged_.data(); }
  std::size_t size() const { return direct_ ? own_.extent(0) : staged_.extent(0); }

  // What MPI wrote, in Exec's space.
  view_type view() const {
    if (direct_) return own_;
    view_type v = view_pool<T, memory_space>::get().allocate(staged_.extent(0));
    kernels::deep_copy(v, staged_);
    return v;
  }

  // Copies what MPI wrote into dst (nothing to do where MPI wrote dst itself).
  void copy_into(const view_type& dst) const {
    if (direct_) {
      if (own_.data() != dst.data() && !planning()) kernels::deep_copy(dst, own_);
    } else {
      kernels::deep_copy(dst, staged_);
    }
  }

 private:
  explicit mpi_buffer(mpi_use use) {
    const mpi_buffers choice = mpi_buffers_from_environment();
    const bool reachable = host_accessible<memory_space> ||
                           (use == mpi_use::transfer && (choice == mpi_buffers::direct || mpi_is_device_aware()));
    direct_ = planning() || (choice != mpi_buffers::staged && reachable);
  }
  bool direct_ = true;
  view_type own_;
  staged_type staged_;
};

// A host copy of a view's data for the host to read (a scalar, a checkpoint): the view itself for
// host memory, once its kernels are done.
template <class Exec, class View>
auto host_copy(const View& v) {
  kernels::fence(Exec{});  // counted in a plan too
  if (planning()) {  // a planned slice has no data: zeros of its size
    using host_view = decltype(kernels::copy_to(Kokkos::HostSpace{}, v));
    return host_view(Kokkos::view_alloc(std::string("meshtensor::planned_host_copy")), v.extent(0));
  }
  return kernels::copy_to(Kokkos::HostSpace{}, v);
}

}  // namespace detail
}  // namespace meshtensor
