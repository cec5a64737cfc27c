#pragma once
// Collective calls written by hand, as a plan's counts (comm_plan::as_counts), and the calls a mesh
// counted against a plan: for the plan checks of the comm_plan cases.
#include <test_support.hpp>

namespace tst {
// Calls only, as written by hand: {collective, axes mask, calls}.
struct expected_call {
  mt::collective kind;
  unsigned axes;
  std::int64_t calls;
};
inline mt::comm_counters counts(std::initializer_list<expected_call> calls) {
  mt::comm_counters c;
  for (const auto& e : calls) c[{e.kind, e.axes}].calls = e.calls;
  return c;
}

// The calls g counted per (collective, axes) equal the plan's (test_support's require_counts).
template <class M>
void require_counts(const M& g, const mt::comm_plan& plan) {
  require_counts(g.counters(), plan.as_counts());
}
}  // namespace tst
