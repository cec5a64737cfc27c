#pragma once
// Where ring attention's blocks are (nn/ring_attention.hpp): the parts of the sequence along the
// ring, each part's chunks, the neighbours, the local [outer, n, inner] of q, k and v, and the
// axes over which k and v are replicated under a split group. Private to nn/.
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../geometry/placement.hpp"
#include "../../geometry/ring_parts.hpp"
#include "../../tensor/tensor.hpp"

namespace meshtensor::detail {

// Where the blocks are: this processor's part along the ring, its neighbours' sub-communicator
// ranks, every part's offset and extent along Length, and the local [outer, n, inner] of k and v
// (kv_outer: the local batch and KV heads), q's outer being kv_outer x group (the local query
// heads per KV head; 1 under multi-head attention).
// Under zigzag<Length, ...> a part is two chunks (placement's ranges: chunk p, then chunk
// 2P - 1 - p), its block their concatenation; under split<> one chunk (the second empty). The
// blocks are computed chunk pair by chunk pair (q's chunk, k's and v's), each at its own global
// positions, so pairs wholly in the future of a q chunk are skipped: with zigzag chunks every
// part then computes the same (the ring's load balance, docs/training.md).
struct ring_geometry : ring_parts {
  std::vector<std::array<std::int64_t, 2>> chunk_offset, chunk_extent;  // per part, its chunks
  std::int64_t kv_outer = 1, group = 1, inner = 1;
  // The elements of part p's k (or v) block: what travels.
  std::int64_t block(int p) const { return kv_outer * extent[p] * inner; }
  // Where chunk c of part p starts in the part's block (along Length).
  std::int64_t chunk_start(int p, int c) const { return c == 0 ? 0 : chunk_extent[static_cast<std::size_t>(p)][0]; }
  // Whether keys chunk e of part k hold a position at or before the last query of this part's
  // chunk c: else that pair is in the future of every query (or a chunk is empty), not computed.
  bool visible(int c, int k, int e) const {
    const auto& q = chunk_extent[static_cast<std::size_t>(me)];
    const auto& kk = chunk_extent[static_cast<std::size_t>(k)];
    return q[c] > 0 && kk[e] > 0 &&
           chunk_offset[static_cast<std::size_t>(k)][e] <= chunk_offset[static_cast<std::size_t>(me)][c] + q[c] - 1;
  }
};

template <Dim Length, Tensor Q, Tensor K>
ring_geometry ring_geometry_of(const Q& q, const K& k) {
  constexpr dim_split s = Q::layout_type::template split_of<Length>();
  const communicator& comm = q.mesh().communicator();
  ring_geometry g;
  static_cast<ring_parts&>(g) = ring_parts_of(s, comm.shape(), comm.coords(), q.template extent<Length>());
  const placement<1> p({s}, comm.shape(), {q.template extent<Length>()});
  for (int k = 0; k < g.parts; ++k) {
    const auto r = p.ranges(0, k);
    g.chunk_offset.push_back({r[0].offset[0], r[1].offset[0]});
    g.chunk_extent.push_back({r[0].extent[0], r[1].extent[0]});
  }
  // q's and k's local data as [outer, Length's local extent, inner] (ops/detail/along.hpp's
  // view, private to ops/)
  const auto outer_inner = [](const auto& t) {
    using T = std::remove_cvref_t<decltype(t)>;
    constexpr std::size_t at = T::template index_of<Length>();
    const auto ext = t.local_extents();
    std::pair<std::int64_t, std::int64_t> oi{1, 1};
    for (std::size_t d = 0; d < T::rank; ++d)
      if (d != at) (d < at ? oi.first : oi.second) *= ext[d];
    return oi;
  };
  const auto [q_outer, q_inner] = outer_inner(q);
  g.kv_outer = outer_inner(k).first;
  g.group = g.kv_outer > 0 ? q_outer / g.kv_outer : 1;  // no k rows: no q rows either
  g.inner = q_inner;
  return g;
}

// The axes over which k and v are replicated while q is split: those of q's head dims that k and
// v lack (Group's), less any that split k. Each processor there holds some of the query heads
// that share a KV head, so its dk and dv are partial sums over them.
template <Tensor Q, Tensor K>
constexpr axis_set ring_group_axes() {
  const auto axes_of = []<class... Ds>(type_list<Ds...>, auto layout) {
    using L = typename decltype(layout)::type;
    return (0u | ... | L::template split_of<Ds>().mask());
  };
  const unsigned q_only =
      axes_of(difference_t<typename Q::dims, typename K::dims>{}, std::type_identity<typename Q::layout_type>{});
  const unsigned of_k = axes_of(typename K::dims{}, std::type_identity<typename K::layout_type>{});
  return axis_set(q_only & ~of_k);
}

}  // namespace meshtensor::detail
