#pragma once
// mesh_shape: a mesh's axis names and sizes as a plain value, with no processes behind it. Layouts,
// placements, describe() and plans need only this; a running mesh adds its communicator. Processors
// are numbered row-major over the axes, last axis fastest (MPI_Cart_create's order with reorder = 0).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "axis_set.hpp"

namespace meshtensor {

// The coordinates of processor `rank` on a mesh of these axis sizes (row-major, last axis fastest),
// written to coords (as many as sizes).
constexpr void coords_of(std::int64_t rank, std::span<const int> sizes, std::span<int> coords) {
  for (std::size_t i = sizes.size(); i-- > 0;) {
    coords[i] = static_cast<int>(rank % sizes[i]);
    rank /= sizes[i];
  }
}

class mesh_shape {
 public:
  mesh_shape() = default;
  // Throws mesh_error naming the axis when a size is below 1 or the names and sizes disagree.
  mesh_shape(std::vector<std::string> axis_names, std::vector<int> sizes)
      : names_(std::move(axis_names)), sizes_(std::move(sizes)) {
    if (names_.size() != sizes_.size())
      throw mesh_error(detail::cat("mesh_shape: ", names_.size(), " axis names but ", sizes_.size(), " sizes"));
    for (std::size_t i = 0; i < sizes_.size(); ++i)
      if (sizes_[i] < 1)
        throw mesh_error(detail::cat("mesh axis '", names_[i], "' has size ", sizes_[i], "; sizes must be >= 1"));
  }

  std::size_t ndims() const { return sizes_.size(); }
  const std::vector<int>& sizes() const { return sizes_; }
  const std::vector<std::string>& axis_names() const { return names_; }
  std::int64_t nprocs() const {
    std::int64_t n = 1;
    for (int s : sizes_) n *= s;
    return n;
  }

  std::vector<int> coords_of(std::int64_t rank) const {
    std::vector<int> c(sizes_.size());
    meshtensor::coords_of(rank, sizes_, c);
    return c;
  }
  std::int64_t rank_of(std::span<const int> coords) const {
    std::int64_t r = 0;
    for (std::size_t i = 0; i < sizes_.size(); ++i) r = r * sizes_[i] + coords[i];
    return r;
  }

  // The coordinates of sub-rank p of the processors that differ from `base` only on the axes of
  // mask, numbered row-major over those axes in mesh order (MPI_Cart_sub's order).
  std::vector<int> peer_coords(std::span<const int> base, axis_set mask, int p) const {
    std::vector<int> c(base.begin(), base.end());
    for (std::size_t i = sizes_.size(); i-- > 0;)
      if (mask.contains(static_cast<int>(i))) {
        c[i] = p % sizes_[i];
        p /= sizes_[i];
      }
    return c;
  }

  // Processors along the axes of a mask (bit i = axis i).
  int size_over(axis_set mask) const {
    int n = 1;
    for (std::size_t i = 0; i < sizes_.size(); ++i)
      if (mask.contains(static_cast<int>(i))) n *= sizes_[i];
    return n;
  }
  // "rows,cols", or "(none)" for an empty mask.
  std::string axes_string(axis_set mask) const {
    std::string s;
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (mask.contains(static_cast<int>(i))) s += detail::cat(s.empty() ? "" : ",", names_[i]);
    return s.empty() ? "(none)" : s;
  }
  // "[rows=2, cols=3]".
  std::string to_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < sizes_.size(); ++i) s += detail::cat(i ? ", " : "", names_[i], "=", sizes_[i]);
    return s + "]";
  }

  friend bool operator==(const mesh_shape&, const mesh_shape&) = default;

 private:
  std::vector<std::string> names_;
  std::vector<int> sizes_;
};

namespace detail {
inline void append_mesh_shapes(std::int64_t rest, int largest, int axes_left, std::vector<int>& prefix,
                               std::vector<std::vector<int>>& out) {
  if (rest == 1) {
    out.push_back(prefix);
    return;
  }
  if (axes_left == 0) return;
  for (std::int64_t f = std::min<std::int64_t>(rest, largest); f >= 2; --f)
    if (rest % f == 0) {
      prefix.push_back(static_cast<int>(f));
      append_mesh_shapes(rest / f, static_cast<int>(f), axes_left - 1, prefix, out);
      prefix.pop_back();
    }
}
}  // namespace detail

// The mesh shapes of `processors` processors with at most max_axes axes, as Mesh-TensorFlow lists
// them: axis sizes of 2 or more in non-increasing order (8 processors: [8], [4, 2], [2, 2, 2]);
// an axis order or an axis of size 1 is a choice of layout, not of shape. Fewest axes first, then
// larger first axes. One processor: the single shape [1]. Throws mesh_error on a count or a
// maximum below 1.
inline std::vector<std::vector<int>> mesh_shapes(std::int64_t processors, int max_axes) {
  if (processors < 1 || processors > INT32_MAX)
    throw mesh_error(detail::cat("mesh_shapes: ", processors, " processors; expected 1 to ", INT32_MAX));
  if (max_axes < 1) throw mesh_error(detail::cat("mesh_shapes: at most ", max_axes, " axes; expected 1 or more"));
  if (processors == 1) return {{1}};
  std::vector<std::vector<int>> out;
  std::vector<int> prefix;
  detail::append_mesh_shapes(processors, static_cast<int>(processors), max_axes, prefix, out);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
  return out;
}

}  // namespace meshtensor
