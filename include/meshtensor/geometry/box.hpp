#pragma once
// Boxes of a row-major array and the runs that copy them: the one place for stride arithmetic.
// Host I/O, checkpoints (safetensors), relayout's packing and the tensor's index maps read these;
// no MPI, no Kokkos.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../error.hpp"

namespace meshtensor {

namespace detail {
inline constexpr int max_rank = 8;  // tensor rank, the width of the kernels' index arrays
}  // namespace detail

// A box of a rank-R tensor: offsets and extents per dim.
template <std::size_t R>
struct box {
  std::array<std::int64_t, R> offset{};
  std::array<std::int64_t, R> extent{};
  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : extent) n *= e;
    return n;
  }
  bool contains(const std::array<std::int64_t, R>& index) const {
    for (std::size_t i = 0; i < R; ++i)
      if (index[i] < offset[i] || index[i] >= offset[i] + extent[i]) return false;
    return true;
  }
  friend bool operator==(const box&, const box&) = default;
};

// The common part of two boxes (extents 0 where they do not meet).
template <std::size_t R>
box<R> intersect(const box<R>& a, const box<R>& b) {
  box<R> r;
  for (std::size_t i = 0; i < R; ++i) {
    r.offset[i] = std::max(a.offset[i], b.offset[i]);
    r.extent[i] = std::max<std::int64_t>(0, std::min(a.offset[i] + a.extent[i], b.offset[i] + b.extent[i]) - r.offset[i]);
  }
  return r;
}

// Row-major strides of extents (the last dim fastest).
template <std::size_t R>
constexpr std::array<std::int64_t, R> row_major_strides(const std::array<std::int64_t, R>& ext) {
  std::array<std::int64_t, R> s{};
  std::int64_t acc = 1;
  for (std::size_t i = R; i-- > 0;) {
    s[i] = acc;
    acc *= ext[i];
  }
  return s;
}
inline std::array<std::int64_t, detail::max_rank> row_major_strides(std::span<const std::int64_t> ext) {
  std::array<std::int64_t, detail::max_rank> s{};
  std::int64_t acc = 1;
  for (std::size_t i = ext.size(); i-- > 0;) s[i] = acc, acc *= ext[i];
  return s;
}

// A region's place in a row-major buffer holding box b from element `base` on.
template <std::size_t R>
std::int64_t offset_in(const box<R>& b, std::int64_t base, const box<R>& region) {
  std::int64_t off = base, stride = 1;
  for (std::size_t i = R; i-- > 0;) {
    off += (region.offset[i] - b.offset[i]) * stride;
    stride *= b.extent[i];
  }
  return off;
}

// Whether `region` (inside b) occupies one contiguous range of b's row-major order: after its first
// dim of extent > 1, it covers b entirely.
template <std::size_t R>
bool contiguous_in(const box<R>& b, const box<R>& region) {
  std::size_t i = 0;
  while (i < R && region.extent[i] == 1) ++i;
  for (std::size_t k = i + 1; k < R; ++k)
    if (region.extent[k] != b.extent[k]) return false;
  return true;
}

// The contiguous runs a region makes in two row-major arrays at once (a source and a destination
// holding boxes that contain it): every run has `length` elements, contiguous in both; run k starts
// at `at(k)` in each. The region's innermost dim and every dim outside it along which it covers both
// arrays whole form one run, so a run is the whole region when it is contiguous in both. Dims
// outside the run of extent 1 are dropped, so `outer` counts only those that vary.
struct box_runs {
  std::int64_t length = 0, count = 0;
  std::int64_t first_a = 0, first_b = 0;  // the region's first element in each array
  int outer = 0;
  std::array<std::int64_t, detail::max_rank> extent{}, stride_a{}, stride_b{};  // the outer dims, outermost first

  // Where run k (0 <= k < count, row-major over the outer dims) starts in array a and array b.
  constexpr std::array<std::int64_t, 2> at(std::int64_t k) const {
    std::int64_t a = first_a, b = first_b;
    for (int i = outer; i-- > 0;) {
      const std::int64_t q = k / extent[i], m = k - q * extent[i];
      k = q;
      a += m * stride_a[i];
      b += m * stride_b[i];
    }
    return {a, b};
  }
};

// The runs of the region (offset, extent) inside arrays a and b, each given by its extents and the
// global offset of its first element; dynamic rank (up to detail::max_rank), as checkpoints need.
inline box_runs runs_between(std::span<const std::int64_t> offset, std::span<const std::int64_t> extent,
                             std::span<const std::int64_t> a_offset, std::span<const std::int64_t> a_extent,
                             std::span<const std::int64_t> b_offset, std::span<const std::int64_t> b_extent) {
  const std::size_t r = extent.size();
  if (r > static_cast<std::size_t>(detail::max_rank))
    throw shape_error(detail::cat("a box of rank ", r, ": meshtensor's tensors have at most ", detail::max_rank, " dims"));
  box_runs runs;
  std::int64_t n = 1;
  for (auto e : extent) n *= e;
  if (n == 0) return runs;
  const auto sa = row_major_strides(a_extent), sb = row_major_strides(b_extent);
  for (std::size_t i = 0; i < r; ++i) {
    runs.first_a += (offset[i] - a_offset[i]) * sa[i];
    runs.first_b += (offset[i] - b_offset[i]) * sb[i];
  }
  runs.length = 1;
  std::size_t k = r;  // dims from k on form one run
  while (k > 0) {
    --k;
    runs.length *= extent[k];
    if (extent[k] != a_extent[k] || extent[k] != b_extent[k]) break;
  }
  for (std::size_t i = 0; i < k; ++i)
    if (extent[i] > 1) {
      runs.extent[runs.outer] = extent[i];
      runs.stride_a[runs.outer] = sa[i];
      runs.stride_b[runs.outer] = sb[i];
      ++runs.outer;
    }
  runs.count = n / runs.length;
  return runs;
}

// The runs of a region inside buffers holding boxes a and b (relayout's packing and unpacking).
template <std::size_t R>
box_runs runs_between(const box<R>& region, const box<R>& a, const box<R>& b) {
  return runs_between(region.offset, region.extent, a.offset, a.extent, b.offset, b.extent);
}

// The runs of box b in the row-major array of global extents `extents` (first of each pair) and in
// b's own row-major order (second): host I/O and checkpoints copy a processor's slice through them.
template <std::size_t R>
box_runs runs_of(const box<R>& b, const std::array<std::int64_t, R>& extents) {
  const std::array<std::int64_t, R> origin{};
  return runs_between(b.offset, b.extent, origin, extents, b.offset, b.extent);
}
inline box_runs runs_of(std::span<const std::int64_t> offset, std::span<const std::int64_t> extent,
                        std::span<const std::int64_t> extents) {
  const std::array<std::int64_t, detail::max_rank> origin{};
  return runs_between(offset, extent, std::span<const std::int64_t>(origin.data(), extent.size()), extents, offset,
                      extent);
}

}  // namespace meshtensor
