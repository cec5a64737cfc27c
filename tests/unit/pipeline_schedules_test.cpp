// Pipeline schedules of a whole step (pipeline/schedules.hpp): every (microbatch, part) runs F, B
// and W once on the stage holding the part, and the simulator runs them without deadlock; gpipe and
// 1f1b order as PipeDream-Flush does; the bubbles the simulator measures against the published
// formulas; the activations each stage holds; the picture; bad arguments name themselves.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <map>
#include <meshtensor/pipeline/schedules.hpp>
#include <tuple>

namespace pl = meshtensor::pipeline;
using Catch::Matchers::ContainsSubstring;

namespace {

// Every schedule this header builds for p stages and m microbatches, with the chunk counts tried.
std::vector<pl::step_schedule> all_schedules(int p, int m) {
  std::vector<pl::step_schedule> out{pl::gpipe_schedule(p, m), pl::one_f_one_b_schedule(p, m), pl::zb_h1_schedule(p, m),
                                     pl::zb_v_schedule(p, m)};
  if (m % p == 0)
    for (int v : {1, 2, 3}) out.push_back(pl::interleaved_1f1b_schedule(p, m, v));
  return out;
}

// Each (microbatch, part) has one F and either one B and one W or one BW, on the stage holding the
// part, and the simulated times honour the dependencies and the stage's order.
void check_complete_and_simulated(const pl::step_schedule& s) {
  INFO(s.name << " p=" << s.stages << " m=" << s.microbatches << " v=" << s.chunks);
  std::map<std::tuple<pl::pass, int, int>, pl::item_timing> ran;
  const pl::simulation run = pl::simulate(s, {1, 2, 3});
  for (int stage = 0; stage < s.stages; ++stage) {
    const auto& items = s.at(stage);
    REQUIRE(run.timings[stage].size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      REQUIRE(items[i].chunk >= 0);
      REQUIRE(items[i].chunk < s.chunks);
      REQUIRE(items[i].microbatch >= 0);
      REQUIRE(items[i].microbatch < s.microbatches);
      const auto key = std::make_tuple(items[i].kind, items[i].microbatch, s.part(stage, items[i].chunk));
      REQUIRE(ran.count(key) == 0);
      ran[key] = run.timings[stage][i];
      if (i > 0) REQUIRE(run.timings[stage][i].start >= run.timings[stage][i - 1].end);
    }
  }
  const auto end_of_b = [&](int b, int k) {
    const auto split = ran.find({pl::pass::B, b, k});
    return split != ran.end() ? split->second.end : ran.at({pl::pass::BW, b, k}).end;
  };
  for (int b = 0; b < s.microbatches; ++b)
    for (int k = 0; k < s.parts(); ++k) {
      REQUIRE(ran.count({pl::pass::F, b, k}) == 1);
      const bool fused = ran.count({pl::pass::BW, b, k}) == 1;
      REQUIRE(ran.count({pl::pass::B, b, k}) == (fused ? 0 : 1));
      REQUIRE(ran.count({pl::pass::W, b, k}) == (fused ? 0 : 1));
      const auto f = ran.at({pl::pass::F, b, k});
      const auto backward = ran.at({fused ? pl::pass::BW : pl::pass::B, b, k});
      if (k > 0) REQUIRE(f.start >= ran.at({pl::pass::F, b, k - 1}).end);
      REQUIRE(backward.start >= f.end);
      if (k + 1 < s.parts()) REQUIRE(backward.start >= end_of_b(b, k + 1));
      if (!fused) REQUIRE(ran.at({pl::pass::W, b, k}).start >= backward.end);
    }
}

}  // namespace

TEST_CASE("pipeline schedules: each microbatch and part runs F, B and W once, where it is held", "[pipeline][schedules]") {
  for (int p : {1, 2, 4})
    for (int m = 1; m <= 8; ++m)
      for (const auto& s : all_schedules(p, m)) check_complete_and_simulated(s);
}

TEST_CASE("pipeline schedules: interleaving holds parts round robin", "[pipeline][schedules]") {
  const auto s = pl::interleaved_1f1b_schedule(4, 8, 2);
  REQUIRE(s.part(1, 0) == 1);
  REQUIRE(s.part(1, 1) == 5);
  REQUIRE(s.holder(6) == std::pair{2, 1});
  // Megatron's order at stage 0: 2 (p - 1) + (v - 1) p = 10 warm-up forwards, microbatches 0..3 on
  // chunk 0, then on chunk 1, then 4, 5 on chunk 0; the first backward is microbatch 0 on chunk 1.
  const std::vector<pl::work_item> start{{pl::pass::F, 0, 0}, {pl::pass::F, 1, 0}, {pl::pass::F, 2, 0},
                                         {pl::pass::F, 3, 0}, {pl::pass::F, 0, 1}, {pl::pass::F, 1, 1},
                                         {pl::pass::F, 2, 1}, {pl::pass::F, 3, 1}, {pl::pass::F, 4, 0},
                                         {pl::pass::F, 5, 0}, {pl::pass::F, 6, 0}, {pl::pass::BW, 0, 1},
                                         {pl::pass::F, 7, 0}, {pl::pass::BW, 1, 1}};
  REQUIRE(std::vector<pl::work_item>(s.at(0).begin(), s.at(0).begin() + 14) == start);
}

TEST_CASE("pipeline schedules: zb-v holds parts in a V", "[pipeline][schedules]") {
  const auto s = pl::zb_v_schedule(4, 8);
  REQUIRE(s.part(0, 0) == 0);
  REQUIRE(s.part(0, 1) == 7);
  REQUIRE(s.part(3, 0) == 3);
  REQUIRE(s.part(3, 1) == 4);
  REQUIRE(s.holder(5) == std::pair{2, 1});
  // The last stage runs parts 3 and 4 back to back: its 2 (p - s) - 1 = 1 warm-up forward on
  // chunk 0, s = 3 pairs of forwards on chunk 1 then chunk 0, then chunk 1's F, B, W.
  using pl::pass;
  const std::vector<pl::work_item> start{{pass::F, 0, 0}, {pass::F, 0, 1}, {pass::F, 1, 0}, {pass::F, 1, 1},
                                         {pass::F, 2, 0}, {pass::F, 2, 1}, {pass::F, 3, 0}, {pass::F, 3, 1},
                                         {pass::B, 0, 1}, {pass::W, 0, 1}};
  REQUIRE(std::vector<pl::work_item>(s.at(3).begin(), s.at(3).begin() + 10) == start);
}

TEST_CASE("pipeline schedules: gpipe and 1f1b in microbatch order, 1f1b warming up with p - s - 1 forwards",
          "[pipeline][schedules]") {
  using pl::pass;
  for (int p : {1, 2, 4})
    for (int m = 1; m <= 8; ++m)
      for (int s = 0; s < p; ++s) {
        const auto gpipe = pl::gpipe_schedule(p, m).at(s), one = pl::one_f_one_b_schedule(p, m).at(s);
        for (int b = 0; b < m; ++b) {
          REQUIRE(gpipe[static_cast<std::size_t>(b)] == pl::work_item{pass::F, b, 0});
          REQUIRE(gpipe[static_cast<std::size_t>(m + b)] == pl::work_item{pass::BW, b, 0});
        }
        REQUIRE(pl::peak_activations(gpipe) == m);
        REQUIRE(pl::peak_activations(one) == std::min(p - s, m));
      }
  const auto first = pl::one_f_one_b_schedule(4, 8).at(0);
  const std::vector<pl::work_item> start{{pass::F, 0, 0}, {pass::F, 1, 0}, {pass::F, 2, 0}, {pass::F, 3, 0},
                                         {pass::BW, 0, 0}, {pass::F, 4, 0}, {pass::BW, 1, 0}};
  REQUIRE(std::vector<pl::work_item>(first.begin(), first.begin() + 7) == start);
  const auto last = pl::one_f_one_b_schedule(4, 8).at(3);
  REQUIRE(last[0] == pl::work_item{pass::F, 0, 0});
  REQUIRE(last[1] == pl::work_item{pass::BW, 0, 0});
  REQUIRE(pl::bubble_fraction(4, 1) == 0.75);
  REQUIRE(pl::bubble_fraction(4, 16) == 3.0 / 19.0);
  REQUIRE(pl::bubble_fraction(1, 8) == 0.0);
}

// The bubbles, per stage, of the published formulas, with several costs (all exact in binary):
//   gpipe, 1f1b (Narayanan et al. 2021, section 2.2.1): (p - 1)(F + B + W), makespan
//     (m + p - 1)(F + B + W);
//   interleaved 1f1b (ibid., section 2.2.2): (p - 1)(F + B + W) / v, each chunk costing 1/v of a
//     stage, m a multiple of p;
//   zb-h1 (Qi et al. 2023, section 3.1 and table 2): (p - 1)(F + B - W), makespan
//     m (F + B + W) + (p - 1)(F + B - W), where the paper's assumptions hold: m >= p and W no
//     dearer than F or B (with W dearer, the deferred Ws no longer fit the bubbles). With
//     F = B = W, a third of 1f1b's. (ZB-H2's (p - 1)(F + B - 2W) needs more memory than ZB-H1.)
TEST_CASE("pipeline schedules: the bubbles of the published formulas", "[pipeline][schedules]") {
  const std::vector<pl::pass_costs> costs{{1, 1, 1}, {2, 2, 1}, {1, 2, 1}, {3, 2, 1}};
  for (const auto& c : costs)
    for (int p : {1, 2, 4})
      for (int m = 1; m <= 16; ++m) {
        INFO("F=" << c.forward << " B=" << c.input_grad << " W=" << c.weight_grad << " p=" << p << " m=" << m);
        const double step = c.forward + c.input_grad + c.weight_grad;
        for (const auto& s : {pl::gpipe_schedule(p, m), pl::one_f_one_b_schedule(p, m)}) {
          const auto run = pl::simulate(s, c);
          REQUIRE(run.makespan == (m + p - 1) * step);
          for (double idle : run.idle) REQUIRE(idle == (p - 1) * step);
        }
        if (m % p == 0)
          for (int v : {1, 2, 4}) {
            const auto run = pl::simulate(pl::interleaved_1f1b_schedule(p, m, v),
                                          {c.forward / v, c.input_grad / v, c.weight_grad / v});
            for (double idle : run.idle) REQUIRE(idle == (p - 1) * step / v);
          }
        if (m >= p) {
          const auto run = pl::simulate(pl::zb_h1_schedule(p, m), c);
          const double bubble = (p - 1) * (c.forward + c.input_grad - c.weight_grad);
          REQUIRE(run.makespan == m * step + bubble);
          for (double idle : run.idle) REQUIRE(idle == bubble);
        }
      }
}

// ZB-V, with F = B = W per chunk (the case the paper builds it for) and m >= 2p - 1 (what fills
// the V): each stage idles (p - 1) F, the least any schedule can: every stage computes the same
// 3 m F, and the last stage cannot start before the p - 1 forwards ahead of it, so the makespan is
// at least (p - 1) F + 3 m F. Below interleaved 1f1b's (p - 1) 3F with v = 2 and ZB-H1's.
TEST_CASE("pipeline schedules: zb-v idles only while the first forward arrives", "[pipeline][schedules]") {
  for (double f : {1.0, 0.5})
    for (int p : {1, 2, 3, 4})
      for (int m = 2 * p - 1; m <= 16; ++m) {
        INFO("F=B=W=" << f << " p=" << p << " m=" << m);
        const auto run = pl::simulate(pl::zb_v_schedule(p, m), {f, f, f});
        REQUIRE(run.makespan == (p - 1) * f + 3 * m * 2 * f);
        for (double idle : run.idle) REQUIRE(idle == (p - 1) * f);
        if (p > 1 && m % p == 0)
          REQUIRE(run.idle[0] < pl::simulate(pl::interleaved_1f1b_schedule(p, m, 2), {f, f, f}).idle[0]);
      }
}

// Activations held, in chunk activations (F keeps one until its W or BW):
//   gpipe all m; 1f1b min(p - s, m);
//   interleaved 1f1b its warm-up plus one, min(2 (p - s - 1) + (v - 1) p + 1, m v): Megatron's
//     count (forward_backward_pipelining_with_interleaving); each chunk activation is 1/v of a
//     stage's, so stage 0 holds p + (p - 1) / v stages' worth against 1f1b's p;
//   zb-h1 min(p, m) at every stage: stage s defers s Ws on top of 1f1b's p - s; the most over
//     the stages is 1f1b's, stage 0's (the paper's p M_B);
//   zb-v at most 2p chunk activations, p stages' worth (1f1b's stage 0, the paper's claim), all
//     2p once m >= 2p - 1 fills the V.
TEST_CASE("pipeline schedules: the activations each stage holds", "[pipeline][schedules]") {
  for (int p : {1, 2, 4})
    for (int m = 1; m <= 16; ++m)
      for (int s = 0; s < p; ++s) {
        INFO("p=" << p << " m=" << m << " stage " << s);
        REQUIRE(pl::peak_activations(pl::gpipe_schedule(p, m).at(s)) == m);
        REQUIRE(pl::peak_activations(pl::one_f_one_b_schedule(p, m).at(s)) == std::min(p - s, m));
        REQUIRE(pl::peak_activations(pl::zb_h1_schedule(p, m).at(s)) == std::min(p, m));
        const int zb_v_peak = pl::peak_activations(pl::zb_v_schedule(p, m).at(s));
        REQUIRE(zb_v_peak <= 2 * p);
        if (m >= 2 * p - 1) REQUIRE(zb_v_peak == 2 * p);
        if (m % p == 0)
          for (int v : {1, 2, 3, 4})
            REQUIRE(pl::peak_activations(pl::interleaved_1f1b_schedule(p, m, v).at(s)) ==
                    std::min(2 * (p - s - 1) + (v - 1) * p + 1, m * v));
      }
  // The simulator reports the same counts.
  REQUIRE(pl::simulate(pl::zb_h1_schedule(4, 8)).peak_activations == std::vector<int>{4, 4, 4, 4});
  REQUIRE(pl::simulate(pl::interleaved_1f1b_schedule(4, 8, 2)).peak_activations == std::vector<int>{11, 9, 7, 5});
}

TEST_CASE("pipeline schedules: zb-h1 defers the Ws of stage s by s microbatches", "[pipeline][schedules]") {
  using pl::pass;
  // Stage 1 of 4: 1f1b's 2 warm-up forwards, one F, B pair with no W, then F, B, W.
  const auto s = pl::zb_h1_schedule(4, 8).at(1);
  const std::vector<pl::work_item> start{{pass::F, 0, 0}, {pass::F, 1, 0}, {pass::F, 2, 0}, {pass::B, 0, 0},
                                         {pass::F, 3, 0}, {pass::B, 1, 0}, {pass::W, 0, 0}};
  REQUIRE(std::vector<pl::work_item>(s.begin(), s.begin() + 7) == start);
  // The last stage ends with its 3 deferred Ws.
  const auto last = pl::zb_h1_schedule(4, 8).at(3);
  const std::vector<pl::work_item> end{{pass::W, 5, 0}, {pass::W, 6, 0}, {pass::W, 7, 0}};
  REQUIRE(std::vector<pl::work_item>(last.end() - 3, last.end()) == end);
}

TEST_CASE("pipeline schedules: the picture of 1f1b, 2 stages, 2 microbatches", "[pipeline][schedules]") {
  // By hand, F = 1 and BW = 2: stage 0 runs F0, F1 (its one warm-up forward, then the first of the
  // steady pair), then waits for stage 1's B0 (stage 1: F0 at 1, B0 over 2..3), runs B0 over 4..5,
  // then waits for stage 1's B1 (F1 at 4, B1 over 5..6) and runs B1 over 7..8.
  const std::string expected =
      "F0 F1 .. .. B0 B0 .. B1 B1\n"
      ".. F0 B0 B0 F1 B1 B1 .. ..\n";
  REQUIRE(pl::picture(pl::one_f_one_b_schedule(2, 2)) == expected);
}

TEST_CASE("pipeline schedules: the simulator finds deadlocks", "[pipeline][schedules]") {
  auto s = pl::one_f_one_b_schedule(2, 1);
  // Stage 0 waits for the backward of microbatch 0 before running the forward it depends on.
  s.per_stage[0] = {{pl::pass::BW, 0, 0}, {pl::pass::F, 0, 0}};
  CHECK_THROWS_WITH(pl::simulate(s), ContainsSubstring("deadlock, stage 0 waits at item 0 (BW of microbatch 0 chunk 0)"));
  s.per_stage[0] = {{pl::pass::F, 0, 0}, {pl::pass::F, 0, 0}, {pl::pass::BW, 0, 0}};
  CHECK_THROWS_WITH(pl::simulate(s), ContainsSubstring("stage 0 runs F of microbatch 0 part 0 twice"));
  // A weight gradient needs its input gradient, even on the same stage.
  auto split = pl::zb_h1_schedule(1, 1);
  split.per_stage[0] = {{pl::pass::F, 0, 0}, {pl::pass::W, 0, 0}, {pl::pass::B, 0, 0}};
  CHECK_THROWS_WITH(pl::simulate(split), ContainsSubstring("deadlock, stage 0 waits at item 1 (W of microbatch 0 chunk 0)"));
}

TEST_CASE("pipeline schedules: validate refuses what cannot run, naming the stage, the item and the microbatch",
          "[pipeline][schedules]") {
  for (const auto& s : all_schedules(4, 8)) CHECK_NOTHROW(pl::validate(s));
  auto s = pl::one_f_one_b_schedule(2, 2);
  s.per_stage[1] = {{pl::pass::BW, 0, 0}, {pl::pass::F, 0, 0}, {pl::pass::F, 1, 0}, {pl::pass::BW, 1, 0}};
  CHECK_THROWS_WITH(pl::validate(s),
                    ContainsSubstring("1f1b: stage 1 item 0 (BW of microbatch 0 chunk 0): comes before its F"));
  s.per_stage[1] = {{pl::pass::F, 0, 0}, {pl::pass::BW, 0, 0}, {pl::pass::F, 1, 0}};
  CHECK_THROWS_WITH(pl::validate(s), ContainsSubstring("stage 1 never runs the B or BW of microbatch 1 chunk 0"));
  s.per_stage[1] = {{pl::pass::F, 1, 0}, {pl::pass::F, 0, 0}, {pl::pass::BW, 0, 0}, {pl::pass::BW, 1, 0}};
  CHECK_THROWS_WITH(pl::validate(s), ContainsSubstring("stage 1 item 1 (F of microbatch 0 chunk 0): comes after "
                                                       "microbatch 1's"));
  s.per_stage[1] = {{pl::pass::F, 0, 0}, {pl::pass::BW, 0, 0}, {pl::pass::F, 2, 0}};
  CHECK_THROWS_WITH(pl::validate(s), ContainsSubstring("stage 1 item 2 (F of microbatch 2 chunk 0): outside the "
                                                       "step's 2 microbatches and 1 chunks"));
  // Each stage's list is sound alone; together they deadlock: stage 0 waits in BW0 for stage 1's,
  // which runs after its F1, which waits for stage 0's F1.
  s = pl::gpipe_schedule(2, 2);
  s.per_stage[0] = {{pl::pass::F, 0, 0}, {pl::pass::BW, 0, 0}, {pl::pass::F, 1, 0}, {pl::pass::BW, 1, 0}};
  CHECK_THROWS_WITH(pl::validate(s), ContainsSubstring("deadlock, stage 0 waits at item 1 (BW of microbatch 0 chunk 0)"));
  s.per_stage[1] = {{pl::pass::F, 1, 0}};
  CHECK_THROWS_WITH(pl::validate(s), ContainsSubstring("stage 1 never runs the F of microbatch 0 chunk 0"));
  auto split = pl::zb_h1_schedule(2, 1);
  split.per_stage[0] = {{pl::pass::F, 0, 0}, {pl::pass::W, 0, 0}, {pl::pass::B, 0, 0}};
  CHECK_THROWS_WITH(pl::validate(split), ContainsSubstring("stage 0 item 1 (W of microbatch 0 chunk 0): comes before its B"));
  split.per_stage[0] = {{pl::pass::F, 0, 0}, {pl::pass::B, 0, 0}};
  CHECK_THROWS_WITH(pl::validate(split), ContainsSubstring("stage 0 never runs the W of microbatch 0 chunk 0"));
  split.per_stage[0] = {{pl::pass::F, 0, 0}, {pl::pass::BW, 0, 0}, {pl::pass::W, 0, 0}};
  CHECK_THROWS_WITH(pl::validate(split), ContainsSubstring("stage 0 item 2 (W of microbatch 0 chunk 0): its backward "
                                                           "was fused (BW)"));
}

TEST_CASE("pipeline schedules: bad arguments name themselves", "[pipeline][schedules]") {
  CHECK_THROWS_WITH(pl::gpipe_order(4, 4, 8), ContainsSubstring("gpipe: stage 4 of 4 with 8 microbatches"));
  CHECK_THROWS_WITH(pl::one_f_one_b_schedule(4, 0), ContainsSubstring("1f1b: stage 0 of 4 with 0 microbatches"));
  CHECK_THROWS_WITH(pl::zb_h1_order(-1, 2, 4), ContainsSubstring("zb-h1: stage -1 of 2 with 4 microbatches"));
  CHECK_THROWS_WITH(pl::interleaved_1f1b_schedule(4, 8, 0),
                    ContainsSubstring("interleaved 1f1b: stage 0 of 4 with 8 microbatches and 0 chunks"));
  CHECK_THROWS_WITH(pl::interleaved_1f1b_schedule(4, 6, 2),
                    ContainsSubstring("interleaved 1f1b: 6 microbatches is not a multiple of the 4 stages"));
  CHECK_THROWS_WITH(pl::zb_v_schedule(4, 8, 3), ContainsSubstring("zb-v: 3 chunks per stage (the V shape takes 2)"));
  CHECK_THROWS_WITH(pl::zb_v_order(4, 4, 8), ContainsSubstring("zb-v: stage 4 of 4 with 8 microbatches and 2 chunks"));
  CHECK_THROWS_WITH(pl::zb_h1_schedule(2, 4).at(2), ContainsSubstring("zb-h1: stage 2 of 2"));
  CHECK_THROWS_WITH(pl::interleaved_1f1b_schedule(2, 4, 2).holder(4), ContainsSubstring("no stage holds part 4 of 4"));
}
