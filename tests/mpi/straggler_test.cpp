// The slow rank named (runtime/straggler.hpp): ranks that sleep between allreduces, one of them
// longer, report that rank as the slowest, by about what it slept more, with a warning; the others'
// work is close to the median. Ranks that work alike raise no warning. Sleeping, not spinning, so
// that ranks sharing a core do not slow each other.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <test_support.hpp>
#include <thread>

using namespace tst;
namespace mt = meshtensor;

namespace {
// `steps` steps of sleeping `ms` (slow_ms on rank `slow`), each ending in an allreduce over the mesh.
mt::straggler_report stretch(const grid& g, mt::straggler_watch& watch, int slow, int ms, int slow_ms, int steps = 5) {
  using X = mt::tensor<double, mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>, i_, j_>;
  const auto x = mt::full<X>(g, {6, 6}, 1.0);
  for (int s = 0; s < steps; ++s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(g.rank() == slow ? slow_ms : ms));
    REQUIRE(mt::item(mt::reduce_sum<i_, j_>(x)) == 36.0);
  }
  return watch.report(g);
}
}  // namespace

TEST_CASE("the rank the others wait for is named, by how much, with a warning") {
  const auto g = world_grid();
  const int slow = g.nprocs() - 1;
  mt::straggler_watch watch(g, 0.1);
  const auto r = stretch(g, watch, slow, 20, 80);
  INFO(r.describe());
  REQUIRE(r.work_seconds.size() == static_cast<std::size_t>(g.nprocs()));
  REQUIRE(r.slowest == slow);
  REQUIRE(r.world_ranks[static_cast<std::size_t>(slow)] == slow);
  if (g.nprocs() == 1) {
    CHECK(r.behind_seconds == 0.0);  // one rank is its own median
    CHECK_FALSE(r.warn);
    return;
  }
  // It slept 5 x 60 ms more than the others, who waited for it in the allreduces.
  CHECK(r.behind_seconds > 0.2);
  CHECK(r.behind_seconds < 0.6);
  CHECK(r.warn);
  for (int k = 0; k < g.nprocs(); ++k)
    if (k != slow) {
      INFO("rank " << k);
      CHECK(r.work_seconds[static_cast<std::size_t>(k)] < r.work_seconds[static_cast<std::size_t>(slow)] - 0.2);
      CHECK(r.wait_seconds[static_cast<std::size_t>(k)] > 0.2);
    }
  CHECK(r.describe().find("WARNING") != std::string::npos);
}

TEST_CASE("ranks that work alike raise no warning; each report covers its own stretch") {
  const auto g = world_grid();
  mt::straggler_watch watch(g, 0.5);
  (void)stretch(g, watch, 0, 20, 120, 3);  // a slow stretch first: the next report must not carry it
  const auto r = stretch(g, watch, -1, 20, 20);
  INFO(r.describe());
  CHECK_FALSE(r.warn);
  CHECK(r.stretch_seconds < 0.6);
  REQUIRE_THROWS_WITH(mt::straggler_watch(g, -0.1), "straggler_watch: the warning threshold -0.1 must be a fraction >= 0");
}
