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
//
// A zigzag dim (zigzag<Dim, Axes...>, dim_order::zigzag) over P parts (parts numbered as above) is
// cut at once into 2P chunks by the balanced-block rule, and part q holds chunk q and chunk
// 2P - 1 - q, stored in that order, one after the other along the dim: under a causal mask the
// early chunk's few keys and the late chunk's many add to the same work on every part (Megatron-
// Core's context-parallel order). Each of its two chunks has n / 2P or n / 2P + 1 elements and the
// first n % 2P are the longer, so part q gets one extra for q < n % 2P and one for
// 2P - 1 - q < n % 2P: both only where n % 2P > P, when every part already has the first. Parts
// therefore differ by at most one element, as contiguous ones do. The chunk count is always 2P
// (derived, so an odd count cannot be asked for), and P = 1 is the identity (chunks 0 and 1 in
// order). A zigzag split nests in nothing: adding or dropping an axis moves chunks between parts,
// so relayouts to or from it are one general exchange (split.hpp's relayout_kind::general).
//
// A processor of a zigzag layout holds pieces, not one box: per zigzag dim two ranges, their
// product over the dims. pieces_at gives them, each with the box the local array would hold were
// it laid out as that piece alone (its frame): copies of a region inside a piece read the local
// array through the frame, with the same box arithmetic as contiguous slices. box_at and box_of
// refuse a zigzag layout, so that no consumer reads one box where there are two.
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

// Part of a processor's slice: the global box it holds (held) and the frame the local row-major
// array is read through for it: the box the array would hold were it all laid out like this piece
// (frame.extent: the local extents; frame.offset: held.offset less the piece's offset in the local
// array). A contiguous slice is one piece whose frame is its box.
template <std::size_t R>
struct piece {
  box<R> held, frame;
  std::array<std::int64_t, R> local_offset() const {
    std::array<std::int64_t, R> o{};
    for (std::size_t d = 0; d < R; ++d) o[d] = held.offset[d] - frame.offset[d];
    return o;
  }
  friend bool operator==(const piece&, const piece&) = default;
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
  bool zigzag(std::size_t d) const { return splits_[d].zigzag(); }
  bool zigzag() const {
    for (std::size_t d = 0; d < R; ++d)
      if (zigzag(d)) return true;
    return false;
  }
  // Where part `part` of dim d starts (contiguous dims only: a zigzag part starts twice; see
  // ranges), and how many elements it holds (either cut).
  std::int64_t part_offset(std::size_t d, std::int64_t part) const {
    refuse_zigzag(d, "part_offset");
    return nested_part(d, part).offset[0];
  }
  std::int64_t part_extent(std::size_t d, std::int64_t part) const {
    const auto r = ranges(d, part);
    return r[0].extent[0] + r[1].extent[0];
  }
  // The ranges part `part` of dim d holds, in local order: a contiguous part's one range and an
  // empty one after it, or a zigzag part's chunks q and 2P - 1 - q.
  std::array<box<1>, 2> ranges(std::size_t d, std::int64_t part) const {
    if (!zigzag(d)) {
      const auto b = nested_part(d, part);
      return {b, box<1>{{b.offset[0] + b.extent[0]}, {0}}};
    }
    const std::int64_t n = extents_[d], chunks = 2 * parts_[d], late = chunks - 1 - part;
    return {box<1>{{block_rule::offset(n, chunks, part)}, {block_rule::size(n, chunks, part)}},
            box<1>{{block_rule::offset(n, chunks, late)}, {block_rule::size(n, chunks, late)}}};
  }
  // The part of dim d that holds global index i (0 <= i < extent).
  std::int64_t part_of(std::size_t d, std::int64_t i) const {
    if (zigzag(d)) {
      const std::int64_t chunks = 2 * parts_[d], c = block_rule::part_of(extents_[d], chunks, i);
      return c < parts_[d] ? c : chunks - 1 - c;
    }
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
  // The smallest and largest part of dim d (equal when the extent divides; a zigzag dim's parts
  // too differ by at most one, the rule above).
  std::int64_t min_part_extent(std::size_t d) const {
    if (zigzag(d)) return extreme_zigzag_part(d, false);
    return extents_[d] / parts_[d];
  }
  std::int64_t max_part_extent(std::size_t d) const {
    if (zigzag(d)) return extreme_zigzag_part(d, true);
    return extents_[d] / parts_[d] + (extents_[d] % parts_[d] ? 1 : 0);
  }
  // The largest slice any processor holds: the product of each dim's largest part (the dims'
  // parts are chosen by disjoint axes, so some processor holds the largest of every dim at once).
  std::int64_t max_local_size() const {
    std::int64_t n = 1;
    for (std::size_t d = 0; d < R; ++d) n *= max_part_extent(d);
    return n;
  }
  // Whether every part of dim d has the same extent (a zigzag dim: every chunk).
  bool even(std::size_t d) const { return extents_[d] % ((zigzag(d) ? 2 : 1) * parts_[d]) == 0; }
  bool even() const {
    for (std::size_t d = 0; d < R; ++d)
      if (!even(d)) return false;
    return true;
  }

  // The extents of the slice held by the processor at these mesh coordinates (either cut).
  std::array<std::int64_t, R> local_extents(std::span<const int> coords) const {
    std::array<std::int64_t, R> e{};
    for (std::size_t d = 0; d != R; ++d) e[d] = part_extent(d, part_at(d, coords));
    return e;
  }
  std::int64_t local_size(std::span<const int> coords) const {
    std::int64_t n = 1;
    for (auto e : local_extents(coords)) n *= e;
    return n;
  }
  // The pieces held by the processor at these mesh coordinates, in local row-major order of their
  // first elements: one (its box) when no dim is zigzag; else a piece per choice of range in each
  // zigzag dim, empty ranges left out (so a processor holding nothing has no piece).
  std::vector<piece<R>> pieces_at(std::span<const int> coords) const {
    std::array<std::array<box<1>, 2>, R> dim_ranges;
    std::array<std::int64_t, R> frame_extent{};
    std::array<int, R> choices{};
    std::size_t count = 1;
    for (std::size_t d = 0; d != R; ++d) {
      dim_ranges[d] = ranges(d, part_at(d, coords));
      frame_extent[d] = dim_ranges[d][0].extent[0] + dim_ranges[d][1].extent[0];
      choices[d] = zigzag(d) ? 2 : 1;
      count *= static_cast<std::size_t>(choices[d]);
    }
    std::vector<piece<R>> out;
    for (std::size_t k = 0; k < count; ++k) {
      piece<R> p;
      bool empty = false;
      std::size_t rest = k;
      for (std::size_t d = R; d-- > 0;) {
        const int c = static_cast<int>(rest % static_cast<std::size_t>(choices[d]));
        rest /= static_cast<std::size_t>(choices[d]);
        const box<1>& r = dim_ranges[d][c];
        const std::int64_t local = c == 0 ? 0 : dim_ranges[d][0].extent[0];
        p.held.offset[d] = r.offset[0];
        p.held.extent[d] = r.extent[0];
        p.frame.offset[d] = r.offset[0] - local;
        p.frame.extent[d] = frame_extent[d];
        empty = empty || (zigzag(d) && r.extent[0] == 0);
      }
      if (!empty) out.push_back(p);
    }
    return out;
  }
  std::vector<piece<R>> pieces_of(std::int64_t rank) const {
    std::array<int, detail::max_axes> c{};
    const std::span<int> coords(c.data(), static_cast<std::size_t>(naxes_));
    coords_of(rank, mesh_sizes(), coords);
    return pieces_at(coords);
  }

  // The box held by the processor at these mesh coordinates (contiguous layouts: a zigzag one
  // holds pieces, pieces_at).
  box<R> box_at(std::span<const int> coords) const {
    for (std::size_t d = 0; d != R; ++d) refuse_zigzag(d, "box_at");
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
  void refuse_zigzag(std::size_t d, const char* what) const {
    if (zigzag(d))
      throw layout_error(detail::cat("placement::", what, ": dim ", d,
                                     " is cut zigzag, so a processor holds two ranges of it; ask pieces_at"));
  }
  std::int64_t extreme_zigzag_part(std::size_t d, bool largest) const {
    std::int64_t e = part_extent(d, 0);
    for (std::int64_t q = 1; q < parts_[d]; ++q) e = largest ? std::max(e, part_extent(d, q)) : std::min(e, part_extent(d, q));
    return e;
  }
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

// Calls f(from_piece, to_piece, region) for every nonempty region that a piece held under one side
// shares with a piece of the other, from's pieces outer, to's inner: the order the general
// relayout packs a block in and unpacks it.
template <std::size_t R, class F>
void for_each_overlap(const std::vector<piece<R>>& from, const std::vector<piece<R>>& to, F&& f) {
  for (const auto& a : from)
    for (const auto& b : to) {
      const box<R> region = intersect(a.held, b.held);
      if (region.size() > 0) f(a, b, region);
    }
}

}  // namespace meshtensor
