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
#include <string>
#include <string_view>

#include "../error.hpp"
#include "../names/names.hpp"
#include "launch.hpp"

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

// Whether kernels over memory space Mem take the GPU's shape: on a device, or where forced.
template <class Mem>
bool gpu_shaped_walk() {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  const row_walk walk = row_walk_from_environment();
  return walk == row_walk::team || (walk == row_walk::automatic && !host);
}

// Elements per work item of an elementwise kernel (the map, fused expressions) over runs of len
// elements: the whole run on a host, one on a GPU. One GPU thread per run gave a 1024 x 1024 slice
// 1024 threads that each walked 4 KiB alone: exp over it took 125 us on an H200, PyTorch's 14.
template <class Mem>
std::int64_t elements_per_item(std::int64_t len) {
  return gpu_shaped_walk<Mem>() ? 1 : len;
}

// Work in items of length(item) elements each (optim's Adam step: runs of parameters), the GPU's
// shape: a team per item, f(item, e) for its elements by the team's threads, so that neighbouring
// threads touch neighbouring elements. A thread per item walked its 4096 elements alone (64
// parameters of 1 K: 432 us on an H200, PyTorch's foreach Adam step 627).
template <class Length, class F, class Member>
struct team_per_item_functor {
  Length length;
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t item = static_cast<std::int64_t>(team.league_rank());
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, length(item)), [&](std::int64_t e) { f(item, e); });
  }
};
template <class Exec, class Length, class F>
void team_per_item(const std::string& name, std::int64_t count, const Length& length, const F& f) {
  using policy = Kokkos::TeamPolicy<Exec>;
  if (count > INT32_MAX) throw error(cat("meshtensor: ", name, " over ", count, " items exceeds a Kokkos team policy's int league"));
  kernels::parallel_for(name, kernels::policy<policy>(static_cast<int>(count), Kokkos::AUTO),
                        team_per_item_functor<Length, F, typename policy::member_type>{length, f});
}

}  // namespace meshtensor::detail
