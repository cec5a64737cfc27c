#pragma once
// dim_split: the mesh axes one tensor dim is split over, and the split algebra every op reads:
// which part a processor holds, what a change of splits needs (relayout_step), which axes a change
// adds, whether it scatters a sum. Values only, constexpr where the layout types decide them; no MPI,
// no Kokkos. The laws are in tests/unit/geometry_test.cpp.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "mesh_shape.hpp"

namespace meshtensor {

namespace detail {
inline constexpr std::size_t max_axes = 8;
}  // namespace detail

// How a split dim's parts are cut: contiguous (split<Dim, Axes...>: part q holds one balanced block,
// nested over the axes) or zigzag (zigzag<Dim, Axes...>: the dim cut into 2P balanced chunks, part q
// holding chunk q and chunk 2P - 1 - q, in that order; geometry/placement.hpp).
enum class dim_order : unsigned char { contiguous, zigzag };

// The axes one dim is split over, as mesh axis indices in the layout rule's order (parts number
// row-major over them, the first axis slowest), and how its parts are cut.
struct dim_split {
  int count = 0;
  std::array<int, detail::max_axes> axes{};
  dim_order order = dim_order::contiguous;
  constexpr bool zigzag() const { return count > 0 && order == dim_order::zigzag; }
  // The same axes as a mask (bit i = mesh axis i; an axis_set converts from it).
  constexpr unsigned mask() const {
    unsigned m = 0;
    for (int i = 0; i < count; ++i) m |= 1u << axes[i];
    return m;
  }
  // Whether the axes are named in mesh order, so that sub-communicator rank order is part order.
  constexpr bool in_mesh_order() const {
    for (int i = 1; i < count; ++i)
      if (axes[i] < axes[i - 1]) return false;
    return true;
  }
  // The number of parts the dim is cut into on a mesh with these axis sizes.
  constexpr std::int64_t parts(std::span<const int> mesh_sizes) const {
    std::int64_t p = 1;
    for (int k = 0; k < count; ++k) p *= mesh_sizes[axes[k]];
    return p;
  }
  // Which part the processor at these mesh coordinates holds.
  constexpr std::int64_t part_at(std::span<const int> mesh_sizes, std::span<const int> coords) const {
    std::int64_t p = 0;
    for (int k = 0; k < count; ++k) p = p * mesh_sizes[axes[k]] + coords[axes[k]];
    return p;
  }
  // The split over these mesh axes, in this order.
  static constexpr dim_split over(std::span<const int> mesh_axes) {
    dim_split s;
    if (mesh_axes.size() > detail::max_axes)
      throw layout_error(detail::cat("a dim split over ", mesh_axes.size(), " axes; meshes have at most ", detail::max_axes));
    for (int a : mesh_axes) s.axes[s.count++] = a;
    return s;
  }
  static constexpr dim_split over(std::initializer_list<int> mesh_axes) {
    return over(std::span<const int>(mesh_axes.begin(), mesh_axes.size()));
  }
  // The zigzag cut over these mesh axes, in this order.
  static constexpr dim_split zigzag_over(std::initializer_list<int> mesh_axes) {
    dim_split s = over(mesh_axes);
    s.order = dim_order::zigzag;
    return s;
  }
  friend constexpr bool operator==(const dim_split&, const dim_split&) = default;
};

// "rows(2) x cols(3)", or "no axis".
inline std::string split_string(const dim_split& s, const mesh_shape& shape) {
  std::string r;
  for (int k = 0; k < s.count; ++k)
    r += detail::cat(k ? " x " : "", shape.axis_names()[s.axes[k]], "(", shape.sizes()[s.axes[k]], ")");
  if (s.zigzag()) r += " zigzag";
  return r.empty() ? "no axis" : r;
}

// The part of each sub-rank of the processors that differ from `coords` only on s's axes (sub-ranks
// number row-major over those axes in mesh order, as MPI_Cart_sub's; parts in the rule's order).
inline std::vector<int> parts_by_subrank(const dim_split& s, const mesh_shape& shape, std::span<const int> coords) {
  std::vector<int> parts(static_cast<std::size_t>(s.parts(shape.sizes())));
  for (int sub = 0; sub < static_cast<int>(parts.size()); ++sub)
    parts[sub] = static_cast<int>(s.part_at(shape.sizes(), shape.peer_coords(coords, s.mask(), sub)));
  return parts;
}

// The longest run of axes two splits start with alike.
constexpr int common_prefix(const dim_split& a, const dim_split& b) {
  int p = 0;
  while (p < a.count && p < b.count && a.axes[p] == b.axes[p]) ++p;
  return p;
}

// general: one alltoallv over `axes`, piece by piece (a zigzag dim changes, or another dim loses
// axes beside one: zigzag parts nest in nothing, so the block paths do not apply). Beside a zigzag
// dim that stays as it is, a dim that only adds axes is local (pieces nest in pieces).
enum class relayout_kind { share, local, allgather, alltoall, general };

// Whether any dim of either side is cut zigzag.
template <std::size_t R>
constexpr bool any_zigzag(const std::array<dim_split, R>& a, const std::array<dim_split, R>& b) {
  for (std::size_t d = 0; d < R; ++d)
    if (a[d].zigzag() || b[d].zigzag()) return true;
  return false;
}

// What moving slices from splits `from` to splits `to` (dim by dim, in position order) needs: nothing
// (share), local slicing, or one collective over `axes`.
struct relayout_step {
  relayout_kind kind = relayout_kind::share;
  axis_set axes;  // the axes the collective runs over
  friend constexpr bool operator==(const relayout_step&, const relayout_step&) = default;
};

// None where every dim's new axes extend its old ones (local slicing, or nothing when nothing
// changes); one alltoall over axes A when dims drop A from the end of their axes and other dims take
// all of A up (a split moving between dims); otherwise one allgather over the axes every dim stops
// being split over (its old axes after the prefix it keeps), then local slicing.
template <std::size_t R>
constexpr relayout_step analyze_relayout(const std::array<dim_split, R>& from, const std::array<dim_split, R>& to) {
  bool same = true, nested = true;
  unsigned gather = 0, taken = 0;
  for (std::size_t d = 0; d < R; ++d) {
    const int p = common_prefix(from[d], to[d]);
    if (p != from[d].count || p != to[d].count) same = false;
    // A new part lies inside the old part only when the old axes are a prefix of the new ones
    // (parts number row-major over the rule's axes); otherwise the axes after the prefix go.
    for (int k = p; k < from[d].count; ++k) gather |= 1u << from[d].axes[k];
    for (int k = p; k < to[d].count; ++k) taken |= 1u << to[d].axes[k];
    // Each dim keeps a prefix of its axes and either drops the rest or appends new ones.
    if (p != from[d].count && p != to[d].count) nested = false;
  }
  // A zigzag side: over every axis of a dim that changes (processors that differ on other axes
  // hold the same parts of the changed dims on both sides).
  if (any_zigzag<R>(from, to)) {
    unsigned changed = 0;
    for (std::size_t d = 0; d < R; ++d)
      if (!(from[d] == to[d])) changed |= from[d].mask() | to[d].mask();
    if (changed == 0) return {relayout_kind::share, 0};  // every dim as it was
    // Every zigzag dim as it was and the other dims only adding axes: each processor's new pieces
    // lie inside its old ones (local slicing, through the pieces' frames).
    bool zigzag_kept = true;
    for (std::size_t d = 0; d < R; ++d)
      if ((from[d].zigzag() || to[d].zigzag()) && !(from[d] == to[d])) zigzag_kept = false;
    if (zigzag_kept && gather == 0) return {relayout_kind::local, 0};
    return {relayout_kind::general, changed};
  }
  if (same) return {relayout_kind::share, 0};
  if (gather == 0) return {relayout_kind::local, 0};
  // Every axis a dim drops is taken up by another dim: processors that differ only on those axes
  // swap equal blocks, one alltoall over them (one axis or several).
  if (nested && (gather & ~taken) == 0) return {relayout_kind::alltoall, gather};
  return {relayout_kind::allgather, gather};
}

// The axes that splits `to` add to `from` where they extend them (local slicing).
template <std::size_t R>
constexpr axis_set added_axes(const std::array<dim_split, R>& from, const std::array<dim_split, R>& to) {
  axis_set added;
  for (std::size_t d = 0; d < R; ++d)
    for (int i = from[d].count; i < to[d].count; ++i) added = added.with(to[d].axes[i]);
  return added;
}

// Whether splits `to` extend `from` dim by dim, the axes they add being exactly `axes`, each once:
// then the relayout of a sum of partials over those axes is one reduce_scatter.
template <std::size_t R>
constexpr bool scatters_over(const std::array<dim_split, R>& from, const std::array<dim_split, R>& to, axis_set axes) {
  if (any_zigzag<R>(from, to)) return false;  // reduce_scatter packs boxes, not pieces
  unsigned added = 0;
  for (std::size_t d = 0; d < R; ++d) {
    if (to[d].count < from[d].count) return false;
    for (int i = 0; i < from[d].count; ++i)
      if (to[d].axes[i] != from[d].axes[i]) return false;
    for (int i = from[d].count; i < to[d].count; ++i) {
      const unsigned bit = 1u << to[d].axes[i];
      if (added & bit) return false;
      added |= bit;
    }
  }
  return added == axes;
}

// The splits with those of the dims marked `dropped` cleared (replicated): what a tensor keeps of its
// layout on the dims another tensor shares (reshape's gather and slice).
template <std::size_t R>
constexpr std::array<dim_split, R> kept_splits(std::array<dim_split, R> splits, const std::array<bool, R>& dropped) {
  for (std::size_t d = 0; d < R; ++d)
    if (dropped[d]) splits[d] = dim_split{};
  return splits;
}

}  // namespace meshtensor
