#pragma once
// ring_attention_plan, ring_attention_backward_plan and ring_attention_traffic_of: what ring
// attention (nn/ring_attention.hpp) sends, as plans and as bytes, known before any run from the
// parts' extents along the sequence. Communication: none (a model of the ring's).
#include <cstdint>
#include <vector>

#include "../plan/comm_plan.hpp"

namespace meshtensor {

// The ring's collectives over the axes A that split Length into `parts` blocks: P - 1 shifts
// forward; P backward (none on one processor), then, for grouped-query attention with Group split
// over axes G that do not split KvHeads (k and v replicated over G), one allreduce of dk and dv
// over G (group_axes: G, empty otherwise).
inline comm_plan ring_attention_plan(axis_set axes, std::int64_t parts) {
  return comm_plan{}.then(collective::shift, axes, parts - 1);
}
inline comm_plan ring_attention_backward_plan(axis_set axes, std::int64_t parts, axis_set group_axes = {}) {
  return comm_plan{}.then(collective::shift, axes, parts > 1 ? parts : 0).then(collective::allreduce, group_axes);
}

// What one processor of the ring sends, before any run: the plans' calls with their bytes. From
// the parts' extents along Length (in part order), this processor's part, the local elements of k
// (or v) per position (local batch x local KV heads x |DKv|: the heads of k and v, not q's, so
// grouped-query attention's blocks are Group times smaller than q's), and the bytes of an element
// of x and of its accumulator (compute_t: the backward message is [k; v; dk; dv] in it). The
// shifts over A: forward_*, backward_*; group_split (Group split over axes that do not split
// KvHeads): the backward allreduce of this part's [dk; dv] over them, group_allreduce_*. A
// planned run counts the same (tests/mpi/ring_attention_gradient_test.cpp checks both against a
// real one).
struct ring_attention_traffic {
  std::int64_t forward_calls = 0, forward_bytes = 0, backward_calls = 0, backward_bytes = 0;
  std::int64_t group_allreduce_calls = 0, group_allreduce_bytes = 0;
};
inline ring_attention_traffic ring_attention_traffic_of(const std::vector<std::int64_t>& part_extents, int me,
                                                        std::int64_t per_position, std::int64_t value_bytes,
                                                        std::int64_t accumulator_bytes, bool group_split = false) {
  const int P = static_cast<int>(part_extents.size());
  const auto block = [&](int p) { return per_position * part_extents[static_cast<std::size_t>(((p % P) + P) % P)]; };
  ring_attention_traffic t;
  for (int s = 0; s + 1 < P; ++s) {
    t.forward_bytes += 2 * block(me - s) * value_bytes;
    t.backward_bytes += 4 * block(me - s) * accumulator_bytes;
  }
  if (P > 1) t.backward_bytes += 2 * block(me + 1) * accumulator_bytes;
  t.forward_calls = P - 1;
  t.backward_calls = P > 1 ? P : 0;
  if (group_split) {
    t.group_allreduce_calls = 1;
    t.group_allreduce_bytes = 2 * block(me) * accumulator_bytes;
  }
  return t;
}

}  // namespace meshtensor
