#pragma once
// Index arithmetic shared by kernels: flat row-major offsets, local to global.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <span>

#include "../geometry/box.hpp"
#include "../names/names.hpp"

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
// A dim may be held as two ranges (a zigzag layout's, geometry/placement.hpp): local indices from
// `second` on are `jump` further along it than the first range's continuation.
template <std::size_t R>
struct local_to_global {
  idx_array<R> local_extent, offset, global_stride, second{}, jump{};
  local_to_global(const std::array<std::int64_t, R>& lext, const std::array<std::int64_t, R>& off,
                  const std::array<std::int64_t, R>& gext)
      : local_extent(to_idx<R>(lext)), offset(to_idx<R>(off)), global_stride(to_idx<R>(row_major_strides<R>(gext))),
        second(to_idx<R>(lext)) {}
  local_to_global(const std::array<std::int64_t, R>& lext, const std::array<std::int64_t, R>& off,
                  const std::array<std::int64_t, R>& gext, const std::array<std::int64_t, R>& second_at,
                  const std::array<std::int64_t, R>& jump_by)
      : local_extent(to_idx<R>(lext)), offset(to_idx<R>(off)), global_stride(to_idx<R>(row_major_strides<R>(gext))),
        second(to_idx<R>(second_at)), jump(to_idx<R>(jump_by)) {}
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t l) const {
    std::int64_t g = 0;
    for (int i = static_cast<int>(R) - 1; i >= 0; --i) {
      const std::int64_t li = l % local_extent[i];
      l /= local_extent[i];
      g += (offset[i] + li + (li >= second[i] ? jump[i] : 0)) * global_stride[i];
    }
    return g;
  }
};

using kidx = Kokkos::Array<std::int64_t, max_rank>;

// Row-major strides of local extents of any rank, for the glue that is not a template on it.
inline kidx row_major_strides_of(std::span<const std::int64_t> ext) {
  const auto strides = row_major_strides(ext);
  kidx s{};
  for (std::size_t i = 0; i < ext.size(); ++i) s[i] = strides[i];
  return s;
}

// Local strides of an operand (local extents in_ext), seen from the local multi-index of a tensor
// whose dim i sits at pos[i] in the operand (in_ext.size() where it lacks it): 0 there
// (broadcast). Not a template: the tensor-typed wrappers (ops/detail/op_support.hpp) only pass the positions, so the
// code is compiled once, not per pair of tensor types (compile time).
inline kidx broadcast_strides_at(std::span<const std::size_t> pos, std::span<const std::int64_t> in_ext) {
  const kidx strides = row_major_strides_of(in_ext);
  kidx s{};
  for (std::size_t i = 0; i != pos.size(); ++i) s[i] = found_at(pos[i], in_ext.size()) ? strides[pos[i]] : 0;
  return s;
}

// Offset of local flat index l of a tensor with local extents ext (rank r) in an operand with
// broadcast strides s.
KOKKOS_INLINE_FUNCTION std::int64_t operand_offset(std::int64_t l, const kidx& ext, const kidx& s, int r) {
  std::int64_t off = 0;
  for (int i = r - 1; i >= 0; --i) {
    off += (l % ext[i]) * s[i];
    l /= ext[i];
  }
  return off;
}

}  // namespace meshtensor::detail
