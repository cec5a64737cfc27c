// Pipeline schedules (pipeline/schedule.hpp): each microbatch runs forward once and backward once,
// the backward after the forward; GPipe holds all m microbatches, 1F1B at most p - s at stage s;
// the bubble formula; bad arguments name themselves.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/pipeline/schedule.hpp>

namespace pl = meshtensor::pipeline;

TEST_CASE("pipeline schedules: each microbatch forward then backward, once") {
  for (auto kind : {pl::schedule_kind::gpipe, pl::schedule_kind::one_f_one_b})
    for (int p : {1, 2, 4})
      for (int m : {1, 3, 4, 8})
        for (int s = 0; s < p; ++s) {
          const auto sched = pl::schedule(kind, s, p, m);
          REQUIRE(sched.size() == static_cast<std::size_t>(2 * m));
          std::vector<int> forward_at(m, -1), backward_at(m, -1);
          for (std::size_t i = 0; i < sched.size(); ++i) {
            auto& at = sched[i].forward ? forward_at : backward_at;
            REQUIRE(at[sched[i].microbatch] == -1);
            at[sched[i].microbatch] = static_cast<int>(i);
          }
          for (int b = 0; b < m; ++b) REQUIRE(forward_at[b] < backward_at[b]);
          // Forwards and backwards each in microbatch order (what the neighbours send).
          for (int b = 1; b < m; ++b) REQUIRE(forward_at[b - 1] < forward_at[b]);
          for (int b = 1; b < m; ++b) REQUIRE(backward_at[b - 1] < backward_at[b]);
          const int held = pl::max_in_flight(sched);
          if (kind == pl::schedule_kind::gpipe) REQUIRE(held == m);
          else REQUIRE(held == std::min(p - s, m));
        }
}

TEST_CASE("1f1b: stage 0 of 4 with 8 microbatches warms up with 3 forwards") {
  const auto s = pl::schedule(pl::schedule_kind::one_f_one_b, 0, 4, 8);
  const std::vector<pl::action> start{{true, 0}, {true, 1}, {true, 2}, {true, 3}, {false, 0}, {true, 4}, {false, 1}};
  REQUIRE(std::vector<pl::action>(s.begin(), s.begin() + 7) == start);
  const auto last = pl::schedule(pl::schedule_kind::one_f_one_b, 3, 4, 8);
  REQUIRE(last[0] == pl::action{true, 0});
  REQUIRE(last[1] == pl::action{false, 0});
}

TEST_CASE("the bubble formula and bad arguments") {
  REQUIRE(pl::bubble_fraction(4, 1) == 0.75);
  REQUIRE(pl::bubble_fraction(4, 16) == 3.0 / 19.0);
  REQUIRE(pl::bubble_fraction(1, 8) == 0.0);
  REQUIRE_THROWS_WITH(pl::schedule(pl::schedule_kind::gpipe, 4, 4, 8),
                      "pipeline schedule: stage 4 of 4 with 8 microbatches (need 0 <= stage < stages and at least one microbatch)");
  REQUIRE_THROWS_WITH(pl::schedule_from_string("zigzag"), "pipeline schedule 'zigzag': expected gpipe or 1f1b");
}
