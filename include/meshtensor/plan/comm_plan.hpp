#pragma once
// The static communication plan of an op: which collectives it calls, over which mesh axes,
// derived from the operand types alone. Tests compare it with the counted calls.
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "collective.hpp"

namespace meshtensor {

struct planned_collective {
  collective kind = collective::allreduce;
  axis_set axes;
  std::int64_t calls = 1;  // the same collective this many times in a row (a ring's P - 1 steps)
  friend constexpr bool operator==(const planned_collective&, const planned_collective&) = default;
};

struct comm_plan {
  // Distinct (collective, axes) pairs, not calls: a step of a pair already planned adds its calls
  // there, so a layer composed of many ops (routed_moe's fourteen) fits.
  static constexpr std::size_t capacity = 8;
  std::size_t size = 0;
  std::array<planned_collective, capacity> steps{};

  // Adds a step unless its axis set is empty (no communication).
  constexpr comm_plan& then(collective kind, axis_set axes) { return then(kind, axes, 1); }
  // The same collective `calls` times (one step that counts `calls`: a ring of P processors calls
  // P - 1 shifts). Nothing when calls is 0 or axes is empty.
  constexpr comm_plan& then(collective kind, axis_set axes, std::int64_t calls) {
    if (axes == 0 || calls <= 0) return *this;
    for (std::size_t i = 0; i < size; ++i)
      if (steps[i].kind == kind && steps[i].axes == axes) {
        steps[i].calls += calls;
        return *this;
      }
    // At compile time a plan past its capacity does not compile; at run time it is refused, not
    // written past the array.
    if (size == capacity) throw std::length_error("meshtensor::comm_plan: more than 8 distinct (collective, axes) steps");
    steps[size++] = {kind, axes, calls};
    return *this;
  }
  constexpr comm_plan& then(const comm_plan& other) {
    for (std::size_t i = 0; i < other.size; ++i) then(other.steps[i].kind, other.steps[i].axes, other.steps[i].calls);
    return *this;
  }
  constexpr bool empty() const { return size == 0; }
  // Calls per (collective, axes), the shape of the counters a run leaves.
  comm_counters as_counts() const {
    comm_counters c;
    for (std::size_t i = 0; i < size; ++i) c[{steps[i].kind, steps[i].axes}].calls += steps[i].calls;
    return c;
  }
};

}  // namespace meshtensor
