#pragma once
// The blocks of a v-collective (allgatherv, alltoallv, reduce_scatter, scatterv, gatherv): per peer,
// how many elements it sends or receives and where they sit in the packed buffer (back to back, in
// peer order), and, where the blocks are regions of a tensor, each peer's box. Relayout's
// collectives, the along-dim ops' allgather, reduce_scatter and host I/O's scatter and gather all
// take their counts and displacements from here, so that arithmetic is written once, in the
// geometry, and unit-tested without MPI (tests/unit/geometry_test.cpp).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "box.hpp"
#include "mesh_shape.hpp"
#include "placement.hpp"

namespace meshtensor {

namespace detail {
// MPI counts are ints: a block or displacement past INT32_MAX elements is refused with its size.
inline int checked_count(std::int64_t n) {
  if (n > INT32_MAX) throw error(cat("meshtensor: a collective of ", n, " elements exceeds MPI's int count"));
  return static_cast<int>(n);
}
}  // namespace detail

// Blocks of the given sizes, back to back in peer order.
struct exchange_blocks {
  std::vector<int> counts, displs;
  std::int64_t total = 0;  // elements of the packed buffer

  exchange_blocks() = default;
  explicit exchange_blocks(std::span<const std::int64_t> sizes) {
    counts.reserve(sizes.size());
    displs.reserve(sizes.size());
    for (const std::int64_t n : sizes) {
      counts.push_back(detail::checked_count(n));
      displs.push_back(detail::checked_count(total));
      total += n;
    }
  }
  std::size_t peers() const { return counts.size(); }
};

// Blocks that are regions of a tensor: each peer's box, packed back to back.
template <std::size_t R>
struct exchange : exchange_blocks {
  std::vector<box<R>> boxes;

  exchange() = default;
  explicit exchange(std::vector<box<R>> peer_boxes) : exchange_blocks(sizes_of(peer_boxes)), boxes(std::move(peer_boxes)) {}

  // Whether every block lies in `region` and is, in region's row-major slice, one contiguous run
  // at the block's own displacement: the slice can be sent or received as the packed buffer.
  bool in_place_in(const box<R>& region) const {
    for (std::size_t p = 0; p < boxes.size(); ++p) {
      const box<R> part = intersect(boxes[p], region);
      if (part.size() != counts[p] || !contiguous_in(region, part) || offset_in(region, 0, part) != displs[p]) return false;
    }
    return true;
  }
  // Whether the packed buffer is `region`'s row-major slice itself: the blocks in place and covering
  // it exactly (then neither packing nor unpacking copies anything).
  bool packs_as(const box<R>& region) const { return total == region.size() && in_place_in(region); }

 private:
  static std::vector<std::int64_t> sizes_of(const std::vector<box<R>>& bs) {
    std::vector<std::int64_t> s;
    s.reserve(bs.size());
    for (const auto& b : bs) s.push_back(b.size());
    return s;
  }
};

// The boxes of the processors over `axes` with this one (at `coords`), in sub-communicator rank
// order, under placement p: what each of them holds (or, for a target placement, will hold).
template <std::size_t R>
std::vector<box<R>> peer_boxes(const placement<R>& p, const mesh_shape& shape, std::span<const int> coords, axis_set axes) {
  const int n = shape.size_over(axes);
  std::vector<box<R>> boxes(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) boxes[q] = p.box_at(shape.peer_coords(coords, axes, q));
  return boxes;
}

// Every processor's box under p, in rank order (host I/O's scatter and gather to one rank).
template <std::size_t R>
exchange<R> all_boxes(const placement<R>& p) {
  std::vector<box<R>> boxes(static_cast<std::size_t>(p.nprocs()));
  for (std::int64_t r = 0; r < p.nprocs(); ++r) boxes[r] = p.box_of(r);
  return exchange<R>(std::move(boxes));
}

}  // namespace meshtensor
