// comm_plan: a layer composed of many ops plans more steps than a plan holds distinct pairs; a step
// of a (collective, axes) pair already planned adds its calls there, and a ninth distinct pair is
// refused rather than written past the plan's array.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/plan/comm_plan.hpp>

#include <stdexcept>

namespace mt = meshtensor;
using mt::collective;

namespace {
// Twelve steps over three pairs, as routed_moe's plan repeats its einsums' allreduces.
constexpr mt::comm_plan twelve_steps() {
  mt::comm_plan p{};
  for (int i = 0; i < 4; ++i) {
    p.then(collective::allreduce, 1u).then(collective::alltoall, 1u);
    p.then(mt::comm_plan{}.then(collective::allreduce, 2u, 3));
  }
  return p.then(collective::allreduce, 0u);  // no axes: no step
}
}  // namespace

TEST_CASE("comm_plan adds the calls of a repeated (collective, axes) pair to its step", "[comm_plan]") {
  constexpr mt::comm_plan p = twelve_steps();
  STATIC_REQUIRE(p.size == 3);
  STATIC_REQUIRE(p.steps[0].kind == collective::allreduce);  // the first pair planned stays first
  const auto counts = p.as_counts();
  REQUIRE(counts.size() == 3);
  REQUIRE(counts.at({collective::allreduce, mt::axis_set(1u)}).calls == 4);
  REQUIRE(counts.at({collective::alltoall, mt::axis_set(1u)}).calls == 4);
  REQUIRE(counts.at({collective::allreduce, mt::axis_set(2u)}).calls == 12);
}

TEST_CASE("comm_plan refuses a ninth distinct pair", "[comm_plan]") {
  mt::comm_plan p{};
  for (unsigned axes = 1; axes <= 8; ++axes) p.then(collective::allgather, axes);
  REQUIRE(p.size == mt::comm_plan::capacity);
  REQUIRE_THROWS_WITH(p.then(collective::allgather, 9u),
                      Catch::Matchers::ContainsSubstring("more than 8 distinct (collective, axes) steps"));
  REQUIRE(p.size == mt::comm_plan::capacity);
}
