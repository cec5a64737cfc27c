#pragma once
// The parts of a dim split over mesh axes A, in ring order: a ring over A passes part p's block from
// the processor that holds it to the one holding part p + 1 (ring attention's k and v blocks,
// einsum_gathered's and einsum_scattered's parts of a sequence). This processor's part, its
// neighbours' sub-communicator ranks (row-major over A in mesh order, as the communicator's
// sub-communicators), and every part's first position and extent along the dim.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "placement.hpp"

namespace meshtensor {

struct ring_parts {
  axis_set axes;
  int parts = 1, me = 0, to = 0, from = 0;  // to: the next part's processor, from: the previous part's
  std::vector<std::int64_t> offset, extent;  // per part (offset: its first range's, for a zigzag cut)
  // The part `back` hops before this processor's along the ring.
  int part(int back) const { return ((me - back) % parts + parts) % parts; }
};

// The ring of split s of a dim of `extent` positions, seen from the processor at coords.
inline ring_parts ring_parts_of(const dim_split& s, const mesh_shape& shape, std::span<const int> coords,
                                std::int64_t extent) {
  ring_parts g;
  g.axes = axis_set(s.mask());
  const auto by_subrank = parts_by_subrank(s, shape, coords);
  g.parts = static_cast<int>(by_subrank.size());
  std::vector<int> subrank_of(by_subrank.size());
  for (std::size_t r = 0; r < by_subrank.size(); ++r) subrank_of[static_cast<std::size_t>(by_subrank[r])] = static_cast<int>(r);
  g.me = static_cast<int>(s.part_at(shape.sizes(), coords));
  g.to = subrank_of[static_cast<std::size_t>((g.me + 1) % g.parts)];
  g.from = subrank_of[static_cast<std::size_t>(g.part(1))];
  const placement<1> p({s}, shape, {extent});
  for (int k = 0; k < g.parts; ++k) {
    g.offset.push_back(p.ranges(0, k)[0].offset[0]);
    g.extent.push_back(p.part_extent(0, k));
  }
  return g;
}

}  // namespace meshtensor
