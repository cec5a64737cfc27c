#pragma once
// Collective calls written by hand, as a plan's counts (comm_plan::as_counts): for the plan checks
// of reductions_test.comm_plan.cpp, reshape_test.cpp and relayout_equivalence_test.cpp.
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
}  // namespace tst
