#pragma once
// How a kernel's work is cut into work items: a host's shape (a thread walks a whole row or run, in
// order, so its loop vectorises and its index arithmetic is paid once) or a GPU's (a team per row,
// a thread per element, so that neighbouring threads touch neighbouring elements and a few long
// rows still fill the device). MESHTENSOR_ROW_WALK=serial or team forces one: the tests run the
// GPU's shape on CPUs this way (label team_rows), so that it is checked where no GPU is, and on a
// GPU it compares the two.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "../error.hpp"
#include "../names/names.hpp"

namespace meshtensor::detail {

enum class row_walk { automatic, serial, team };

inline row_walk row_walk_from_environment() {
  static const row_walk walk = [] {
    const char* v = std::getenv("MESHTENSOR_ROW_WALK");
    const std::string_view value = v ? v : "";
    if (value.empty() || value == "automatic") return row_walk::automatic;
    if (value == "serial") return row_walk::serial;
    if (value == "team") return row_walk::team;
    throw error(cat("meshtensor: MESHTENSOR_ROW_WALK is '", value, "'; expected serial, team or automatic"));
  }();
  return walk;
}

// Elements per work item of an elementwise kernel (the map, fused expressions) over runs of len
// elements: the whole run on a host, one on a GPU. One GPU thread per run gave a 1024 x 1024 slice
// 1024 threads that each walked 4 KiB alone: exp over it took 125 us on an H200, PyTorch's 14.
template <class Mem>
std::int64_t elements_per_item(std::int64_t len) {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  const row_walk walk = row_walk_from_environment();
  return walk == row_walk::team || (walk == row_walk::automatic && !host) ? 1 : len;
}

}  // namespace meshtensor::detail
