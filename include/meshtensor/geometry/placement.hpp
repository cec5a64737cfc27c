#pragma once
// placement<R>: which processor holds which box of a rank-R tensor. A small value built from the
// tensor's splits (from its layout type), the mesh's axis sizes and the global extents, with no MPI:
// tensors, host I/O, relayout, the along-dim ops, describe() and plans all ask it, so the
// arithmetic of slices lives here and nowhere else.
//
// The rule for one dim of extent n cut into p parts (balanced blocks): part q holds the
// contiguous range [q * (n / p) + min(q, n % p), ...) of n / p elements, one more for the first
// n % p parts. Parts differ by at most one element, and a part is empty only when n < p. (The
// other common rule, ceil(n / p) for the leading parts as torch.chunk does, leaves up to p - 1
// parts nearly empty: 9 over 8 gives 2,2,2,2,1,0,0,0 where this rule gives 2,1,1,1,1,1,1,1.)
//
// A dim split over several axes is cut nested, axis by axis in the order the layout rule names
// them: balanced blocks over the first axis, each of those in balanced blocks over the second, and
// so on. Parts number row-major over those axes, so their offsets increase with the part number.
// Nesting keeps every part at n / P or n / P + 1 elements (P the product of the sizes:
// floor(floor(n / a) / b) = floor(n / ab), and the same for ceil), and it makes a split over
// (a, b) a refinement of the split over (a): adding a trailing axis only cuts what a processor
// holds, dropping one only gathers it back, as with even extents. Cutting into P parts at once
// would not nest: 10 over 2 x 3 is 2,2,2,2,1,1 cut at once, but 5 + 5 over 2 then 2,2,1 + 2,2,1
// over 3, so the processor holding [4, 6) under (a, b) would hold [5, 10) under (a).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "box.hpp"
#include "mesh_shape.hpp"
#include "split.hpp"

namespace meshtensor {

// The balanced-block rule for one dim: n elements in p parts.
struct block_rule {
  static constexpr std::int64_t size(std::int64_t n, std::int64_t p, std::int64_t q) {
    return n / p + (q < n % p ? 1 : 0);
  }
  static constexpr std::int64_t offset(std::int64_t n, std::int64_t p, std::int64_t q) {
    return q * (n / p) + std::min(q, n % p);
  }
  // The part holding element i (0 <= i < n).
  static constexpr std::int64_t part_of(std::int64_t n, std::int64_t p, std::int64_t i) {
    const std::int64_t big = n / p + 1, r = n % p;
    return i < r * big ? i / big : r + (i - r * big) / (n / p);
  }
};

template <std::size_t R>
class placement {
 public:
  using extents_type = std::array<std::int64_t, R>;

  placement() = default;
  placement(const std::array<dim_split, R>& splits, std::span<const int> mesh_sizes, const extents_type& extents)
      : splits_(splits), extents_(extents), naxes_(static_cast<int>(mesh_sizes.size())) {
    std::copy(mesh_sizes.begin(), mesh_sizes.end(), sizes_.begin());
    for (std::size_t d = 0; d != R; ++d) parts_[d] = splits_[d].parts(mesh_sizes);
  }
  placement(const std::array<dim_split, R>& splits, const mesh_shape& shape, const extents_type& extents)
      : placement(splits, std::span<const int>(shape.sizes()), extents) {}

  const std::array<dim_split, R>& splits() const { return splits_; }
  const extents_type& extents() const { return extents_; }
  std::span<const int> mesh_sizes() const { return {sizes_.data(), static_cast<std::size_t>(naxes_)}; }
  std::int64_t nprocs() const {
    std::int64_t n = 1;
    for (int a = 0; a < naxes_; ++a) n *= sizes_[a];
    return n;
  }

  // Number of parts dim d is cut into.
  std::int64_t parts(std::size_t d) const { return parts_[d]; }
  // Which part of dim d the processor at these mesh coordinates holds.
  std::int64_t part_at(std::size_t d, std::span<const int> coords) const {
    return splits_[d].part_at(mesh_sizes(), coords);
  }
  // Where part `part` of dim d starts, and how long it is (the nested rule above).
  std::int64_t part_offset(std::size_t d, std::int64_t part) const { return nested_part(d, part).offset[0]; }
  std::int64_t part_extent(std::size_t d, std::int64_t part) const { return nested_part(d, part).extent[0]; }
  // The part of dim d that holds global index i (0 <= i < extent).
  std::int64_t part_of(std::size_t d, std::int64_t i) const {
    std::int64_t n = extents_[d], at = 0, part = 0;
    for (int k = 0; k < splits_[d].count; ++k) {
      const std::int64_t p = sizes_[splits_[d].axes[k]];
      const std::int64_t q = block_rule::part_of(n, p, i - at);
      part = part * p + q;
      at += block_rule::offset(n, p, q);
      n = block_rule::size(n, p, q);
    }
    return part;
  }
  // The smallest and largest part of dim d (equal when the extent divides).
  std::int64_t min_part_extent(std::size_t d) const { return extents_[d] / parts_[d]; }
  std::int64_t max_part_extent(std::size_t d) const {
    return extents_[d] / parts_[d] + (extents_[d] % parts_[d] ? 1 : 0);
  }
  bool even(std::size_t d) const { return extents_[d] % parts_[d] == 0; }
  bool even() const {
    for (std::size_t d = 0; d < R; ++d)
      if (!even(d)) return false;
    return true;
  }

  // The box held by the processor at these mesh coordinates.
  box<R> box_at(std::span<const int> coords) const {
    box<R> b;
    for (std::size_t d = 0; d != R; ++d) {
      const auto part = nested_part(d, part_at(d, coords));
      b.offset[d] = part.offset[0];
      b.extent[d] = part.extent[0];
    }
    return b;
  }
  // The box held by the processor of this mesh rank (row-major over the axes, last fastest).
  box<R> box_of(std::int64_t rank) const {
    std::array<int, detail::max_axes> c{};
    const std::span<int> coords(c.data(), static_cast<std::size_t>(naxes_));
    coords_of(rank, mesh_sizes(), coords);
    return box_at(coords);
  }

  // Every mesh rank whose box holds this global index (one per replica), in rank order.
  std::vector<std::int64_t> owners(const extents_type& index) const {
    // Coordinates fixed by the dims' parts; -1 where an axis splits no dim (any coordinate).
    std::array<int, detail::max_axes> fixed;
    fixed.fill(-1);
    for (std::size_t d = 0; d < R; ++d) {
      std::int64_t q = part_of(d, index[d]);
      for (int k = splits_[d].count; k-- > 0;) {
        const int a = splits_[d].axes[k];
        fixed[a] = static_cast<int>(q % sizes_[a]);
        q /= sizes_[a];
      }
    }
    std::vector<std::int64_t> ranks;
    std::array<int, detail::max_axes> c{};
    const std::span<int> coords(c.data(), static_cast<std::size_t>(naxes_));
    for (std::int64_t r = 0, n = nprocs(); r < n; ++r) {
      coords_of(r, mesh_sizes(), coords);
      bool match = true;
      for (int a = 0; a < naxes_ && match; ++a) match = fixed[a] < 0 || fixed[a] == c[a];
      if (match) ranks.push_back(r);
    }
    return ranks;
  }

 private:
  // The nested rule: the part's digits over the split's axes (row-major, last fastest), applied
  // from the first axis in. Returns offset and extent in a box<1>.
  box<1> nested_part(std::size_t d, std::int64_t part) const {
    std::array<std::int64_t, detail::max_axes> digit{};
    for (int k = splits_[d].count; k-- > 0;) {
      const std::int64_t p = sizes_[splits_[d].axes[k]];
      digit[k] = part % p;
      part /= p;
    }
    std::int64_t n = extents_[d], at = 0;
    for (int k = 0; k < splits_[d].count; ++k) {
      const std::int64_t p = sizes_[splits_[d].axes[k]];
      at += block_rule::offset(n, p, digit[k]);
      n = block_rule::size(n, p, digit[k]);
    }
    return {{at}, {n}};
  }

  std::array<dim_split, R> splits_{};
  extents_type extents_{};
  std::array<std::int64_t, R> parts_{};
  std::array<int, detail::max_axes> sizes_{};
  int naxes_ = 0;
};

// What the processor of rank `from_rank` under `from` holds of what rank `to_rank` holds under `to`:
// the block a relayout or a resharding load moves between them.
template <std::size_t R>
box<R> overlap(const placement<R>& from, std::int64_t from_rank, const placement<R>& to, std::int64_t to_rank) {
  return intersect(from.box_of(from_rank), to.box_of(to_rank));
}

}  // namespace meshtensor
