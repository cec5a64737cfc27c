#pragma once
// The geometry of sliding windows (unfold, fold, conv, pooling) over a split dim: which input
// positions a window reads, and which of them a processor must receive from its neighbours or
// gather, decided from the placement alone (the same on every processor). Values only: no MPI, no
// Kokkos; the ops move the halos (ops/unfold.hpp) and their laws are unit tests without MPI.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>

#include "../error.hpp"
#include "mesh_shape.hpp"
#include "placement.hpp"
#include "split.hpp"

namespace meshtensor {

enum class padding {
  valid,  // windows lie inside the extent: extent - span + 1 positions (span: (size-1)*dilation+1)
  same,   // ceil(extent / stride) positions, padded as TensorFlow does (the odd element at the end)
};

// A kernel's window along one spatial dim.
struct window {
  std::int64_t size = 1;
  std::int64_t stride = 1;
  std::int64_t dilation = 1;
  padding pad = padding::valid;
};

// The halo schedule (public: its laws are unit-tested in tests/unit/geometry_test.cpp, without MPI):
// a window's geometry along one dim, and per processor the path and extent of the halo it reads;
// shift's path by the same vocabulary.

// One window's positions along a dim of the given extent: output o, tap k reads input
// o * stride - pad_lo + k * dilation (outside [0, extent): the fill value).
struct window_geometry {
  std::int64_t extent = 0, out = 0, size = 1, stride = 1, dilation = 1, pad_lo = 0;

  // The input [lo, hi) read by outputs [ob, oe), within [0, extent); empty when no output is.
  std::pair<std::int64_t, std::int64_t> reads(std::int64_t ob, std::int64_t oe) const {
    if (oe <= ob) return {0, 0};
    const std::int64_t lo = std::max<std::int64_t>(0, ob * stride - pad_lo);
    const std::int64_t hi = std::min(extent, (oe - 1) * stride - pad_lo + (size - 1) * dilation + 1);
    return {lo, std::max(lo, hi)};
  }
};

// The geometry of window w along dim `dim` of extent `extent`; shape_error naming op and dim when
// the window is malformed or (padding valid) does not fit.
inline window_geometry geometry_of(const char* op, std::string_view dim, std::int64_t extent, const window& w) {
  if (w.size < 1 || w.stride < 1 || w.dilation < 1)
    throw shape_error(detail::cat(op, ": the window along dim '", dim, "' needs size, stride and dilation of at least 1 (got size ",
                          w.size, ", stride ", w.stride, ", dilation ", w.dilation, ")"));
  window_geometry g{extent, 0, w.size, w.stride, w.dilation, 0};
  const std::int64_t span = (w.size - 1) * w.dilation + 1;
  if (w.pad == padding::valid) {
    if (extent < span)
      throw shape_error(detail::cat(op, ": a window spanning ", span, " elements (size ", w.size, ", dilation ", w.dilation,
                            ") does not fit dim '", dim, "' of extent ", extent, " with padding valid"));
    g.out = (extent - span) / w.stride + 1;
  } else {
    g.out = (extent + w.stride - 1) / w.stride;
    g.pad_lo = std::max<std::int64_t>(0, (g.out - 1) * w.stride + span - extent) / 2;
  }
  return g;
}

enum class halo_path { local, neighbours, gather };

// How one spatial dim's halo moves on one processor: nothing (the dim is not split), from the two
// neighbours (split over one axis, and no window reaches past a neighbour's part), or the dim
// gathered whole.
struct halo_dim {
  halo_path path = halo_path::local;
  std::size_t index = 0;  // position of D in the input
  dim_split split{};
  window_geometry geo;
  std::int64_t own_lo = 0, own_hi = 0;    // this processor's part of D's input
  std::int64_t need_lo = 0, need_hi = 0;  // the input its windows read
  // Neighbours path: halo elements received from the left and right neighbours, and sent to them
  // (the elements their windows read here), with where the sent ones start (global index).
  std::int64_t from_left = 0, from_right = 0, to_left = 0, to_right = 0;
  std::int64_t to_left_at = 0, to_right_at = 0;
  // D's range in the working buffer once this dim's halo is in: [buf_lo, buf_hi).
  std::int64_t buf_lo = 0, buf_hi = 0;
};

// The path of a shift by `reach` elements along a dim cut by `split` into parts of at least
// `min_part` elements: nothing moves where the dim is not split (local); from the neighbour on the
// dim's one axis where every part holds at least |reach| elements, so that what enters a part comes
// from the adjacent part alone (neighbours); else the dim gathered whole (gather). Decided from the
// placement, so every processor takes the same path (ops/shift.hpp).
inline halo_path shift_halo_path(const dim_split& split, std::int64_t min_part, std::int64_t reach) {
  if (split.count == 0) return halo_path::local;
  const std::int64_t r = reach < 0 ? -reach : reach;
  return split.count == 1 && r <= min_part ? halo_path::neighbours : halo_path::gather;
}

// The halo of the processor at `coords` along a dim at position `index`, split by `split`, read by
// windows of geometry `geo` (input and output cut alike by the split's balanced blocks).
inline halo_dim schedule_halo(std::size_t index, const dim_split& split, const window_geometry& geo,
                              const mesh_shape& shape, std::span<const int> coords) {
  halo_dim h;
  h.index = index;
  h.split = split;
  h.geo = geo;
  const placement<1> in({split}, shape, {geo.extent}), out({split}, shape, {geo.out});
  const std::int64_t parts = in.parts(0);
  auto own = [&](std::int64_t q) { return std::pair{in.part_offset(0, q), in.part_offset(0, q) + in.part_extent(0, q)}; };
  auto need = [&](std::int64_t q) { return geo.reads(out.part_offset(0, q), out.part_offset(0, q) + out.part_extent(0, q)); };
  // Elements part q reads from the part before it, and from the part after it.
  auto left_of = [&](std::int64_t q) { return std::max<std::int64_t>(0, std::min(need(q).second, own(q).first) - need(q).first); };
  auto right_of = [&](std::int64_t q) { return std::max<std::int64_t>(0, need(q).second - std::max(need(q).first, own(q).second)); };
  const std::int64_t me = split.part_at(shape.sizes(), coords);
  std::tie(h.own_lo, h.own_hi) = own(me);
  std::tie(h.need_lo, h.need_hi) = need(me);
  if (split.count == 0) {
    h.buf_lo = 0;
    h.buf_hi = geo.extent;
    return h;
  }
  bool near = split.count == 1;
  for (std::int64_t q = 0; near && q < parts; ++q)
    near = (left_of(q) == 0 || need(q).first >= own(q - 1).first) && (right_of(q) == 0 || need(q).second <= own(q + 1).second);
  if (!near) {
    h.path = halo_path::gather;
    h.buf_lo = 0;
    h.buf_hi = geo.extent;
    return h;
  }
  h.path = halo_path::neighbours;
  h.from_left = left_of(me);
  h.from_right = right_of(me);
  if (me + 1 < parts) {
    h.to_right = left_of(me + 1);
    h.to_right_at = need(me + 1).first;
  }
  if (me > 0) {
    h.to_left = right_of(me - 1);
    h.to_left_at = std::max(need(me - 1).first, own(me - 1).second);
  }
  // Nothing to receive: the buffer stays this processor's own slice (the kernels index by range).
  h.buf_lo = h.from_left + h.from_right == 0 ? h.own_lo : h.need_lo;
  h.buf_hi = h.from_left + h.from_right == 0 ? h.own_hi : h.need_hi;
  return h;
}

}  // namespace meshtensor
