#pragma once
// Index arithmetic shared by kernels: flat row-major offsets, local to global.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>

#include "../geometry/box.hpp"

namespace meshtensor::detail {

// Kokkos::Array works inside device kernels; rank 0 keeps one unused slot.
template <std::size_t R>
using idx_array = Kokkos::Array<std::int64_t, (R == 0 ? 1 : R)>;

template <std::size_t R>
idx_array<R> to_idx(const std::array<std::int64_t, R>& a) {
  idx_array<R> r{};
  for (std::size_t i = 0; i < R; ++i) r[i] = a[i];
  return r;
}

// Maps a local flat index to the global flat index of the same element.
template <std::size_t R>
struct local_to_global {
  idx_array<R> local_extent, offset, global_stride;
  local_to_global(const std::array<std::int64_t, R>& lext, const std::array<std::int64_t, R>& off,
                  const std::array<std::int64_t, R>& gext)
      : local_extent(to_idx<R>(lext)), offset(to_idx<R>(off)), global_stride(to_idx<R>(row_major_strides<R>(gext))) {}
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t l) const {
    std::int64_t g = 0;
    for (int i = static_cast<int>(R) - 1; i >= 0; --i) {
      const std::int64_t li = l % local_extent[i];
      l /= local_extent[i];
      g += (offset[i] + li) * global_stride[i];
    }
    return g;
  }
};

}  // namespace meshtensor::detail
