// plan_differences: what --check-plan prints when a real step and its plan disagree. In one
// process: a plan_report and counters are plain values.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/plan/report.hpp>

#include <string>

namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
// Names axis sets as a mesh [rows x cols] does.
struct two_axes {
  std::string axes_string(mt::axis_set axes) const {
    const unsigned mask = axes.mask();
    return mask == 1 ? "rows" : mask == 2 ? "cols" : mask == 3 ? "rows, cols" : "none";
  }
};
}  // namespace

TEST_CASE("plan_differences is empty when the plan equals the step, and names each difference", "[unit]") {
  mt::comm_counters counted;
  counted[{mt::collective::allreduce, 2}] = {3, 1200};
  counted[{mt::collective::allgather, 1}] = {1, 64};
  mt::plan_report planned;
  planned.totals = counted;
  planned.live[static_cast<int>(mt::memory_kind::parameters)] = 4096;
  planned.live[static_cast<int>(mt::memory_kind::optimizer_state)] = 8192;
  REQUIRE(mt::plan_differences(two_axes{}, counted, planned, 4096, 8192).empty());

  // One allreduce more in the plan: both sides listed, with the axes named.
  planned.totals[{mt::collective::allreduce, 2}] = {4, 1600};
  const auto collectives = mt::plan_differences(two_axes{}, counted, planned, 4096, 8192);
  REQUIRE_THAT(collectives, ContainsSubstring("collectives differ"));
  REQUIRE_THAT(collectives, ContainsSubstring("real allreduce over {cols}: 3 calls, 1200 bytes"));
  REQUIRE_THAT(collectives, ContainsSubstring("planned allreduce over {cols}: 4 calls, 1600 bytes"));
  REQUIRE_THAT(collectives, ContainsSubstring("allgather over {rows}: 1 calls, 64 bytes"));

  // Memory only.
  planned.totals = counted;
  const auto memory = mt::plan_differences(two_axes{}, counted, planned, 4000, 8000);
  REQUIRE_THAT(memory, ContainsSubstring("parameter bytes: planned 4096, real 4000"));
  REQUIRE_THAT(memory, ContainsSubstring("optimizer state bytes: planned 8192, real 8000"));
  REQUIRE_THAT(memory, !ContainsSubstring("collectives"));

  // The host's waits for the device, where the step's are given.
  planned.waits = 5;
  REQUIRE(mt::plan_differences(two_axes{}, counted, planned, 4096, 8192).empty());  // not given: not compared
  REQUIRE(mt::plan_differences(two_axes{}, counted, planned, 4096, 8192, 5).empty());
  REQUIRE(mt::plan_differences(two_axes{}, counted, planned, 4096, 8192, 6) == "waits for the device: planned 5, real 6\n");
}

// A ragged dispatch's returned rows: how many each rank sends is the router's choice, which a plan
// counts as an even share. Those bytes differ per rank without a difference (agree_on_plan compares
// their sum over the ranks); the rest of the same collective's bytes still must equal.
TEST_CASE("plan_differences leaves the bytes the data routes to the sum over the ranks", "[unit]") {
  mt::comm_counters counted;
  counted[{mt::collective::alltoall, 1}] = {3, 1000, 600};
  mt::plan_report planned;
  planned.totals[{mt::collective::alltoall, 1}] = {3, 900, 500};
  REQUIRE(mt::plan_differences(two_axes{}, counted, planned, 0, 0).empty());
  planned.totals[{mt::collective::alltoall, 1}] = {3, 900, 400};  // 500 fixed bytes against 400
  const auto fixed = mt::plan_differences(two_axes{}, counted, planned, 0, 0);
  REQUIRE_THAT(fixed, ContainsSubstring("real alltoall over {rows}: 3 calls, 1000 bytes (600 of them routed by the data)"));
  REQUIRE_THAT(fixed, ContainsSubstring("planned alltoall over {rows}: 3 calls, 900 bytes (400 of them routed by the data)"));
}
