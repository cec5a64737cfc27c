#pragma once
// axis_set: a set of mesh axes, by index (axis i of the mesh's axis list): what a collective runs
// over, what a dim is split over as a set, what a partial sum still owes. A value over a bit mask,
// which is also the key MPI sub-communicators and the counters are stored by (mask()).
//
// It converts implicitly from a mask (bit i = axis i), so that `comm.size_over(0b11)` and a
// test's `{collective::allreduce, 1u}` read as before; it never converts back implicitly, so code
// that takes a set says so in its signature and asks it questions (contains, empty) instead of
// testing bits.
#include <compare>

namespace meshtensor {

struct axis_set {
  unsigned bits = 0;  // public: a structural type, usable as a template argument

  constexpr axis_set() = default;
  constexpr axis_set(unsigned mask) : bits(mask) {}  // NOLINT: implicit, see above

  constexpr unsigned mask() const { return bits; }
  constexpr bool empty() const { return bits == 0; }
  constexpr bool contains(int axis) const { return (bits >> axis) & 1u; }
  constexpr axis_set with(int axis) const { return {bits | (1u << axis)}; }

  friend constexpr axis_set operator|(axis_set a, axis_set b) { return {a.bits | b.bits}; }
  friend constexpr axis_set operator&(axis_set a, axis_set b) { return {a.bits & b.bits}; }
  friend constexpr bool operator==(axis_set, axis_set) = default;
  friend constexpr auto operator<=>(axis_set, axis_set) = default;
};

}  // namespace meshtensor
