// Communication behind computation in the cost model (plan/timeline.hpp, plan/cost_model.hpp's
// communication_of): a plan records its collectives in order among its local work, and the
// replay charges a started collective only what the work done while it was in flight leaves. The
// expected times are worked out by hand from round rates.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/meshtensor.hpp>
#include <meshtensor/plan/cost_model.hpp>

namespace mt = meshtensor;

namespace {
struct a : mt::dim<"a"> {};
struct b : mt::dim<"b"> {};
struct c : mt::dim<"c"> {};
struct d : mt::dim<"d"> {};
struct m1 : mt::axis<"m1"> {};
struct m2 : mt::axis<"m2"> {};
using mesh2 = mt::mesh<m1, m2>;

// Products at 1 ns per FLOP and nothing else local; an allgather over 4 processors 40 us a call
// and 1 ns a byte; over 2, 20 us and 1 ns.
mt::machine_calibration products_only() {
  mt::machine_calibration c;
  c.gemm_flops_per_s = 1e9;
  c.bytes_per_s = c.optimizer_bytes_per_s = c.host_bytes_per_s = 1e30;
  c.seconds_per_kernel = 0;
  for (int size : {2, 4})
    for (auto kind : {mt::collective::allgather, mt::collective::allreduce, mt::collective::send})
      c.collectives[{kind, size}] = {1e-5 * size, 1e-9};
  return c;
}

mt::plan_event event(mt::plan_event_kind kind, mt::collective op, unsigned axes, std::int64_t bytes,
                     std::int64_t ticket = -1, std::int64_t flops_before = 0) {
  mt::plan_event e{kind, op, mt::axis_set(axes), bytes, ticket, {}};
  if (flops_before) e.before.products.push_back({1000, flops_before, false});
  return e;
}
}  // namespace

TEST_CASE("the replay: a started collective costs what the work in flight leaves", "[planned]") {
  mt::plan_report r;
  r.shape = mt::mesh_shape({"m1", "m2"}, {4, 2});
  using K = mt::plan_event_kind;
  const auto ag = mt::collective::allgather;
  // Two gathers of 40000 bytes over m1 (80 us each), started back to back: the second's transfer
  // waits for the first's (one link), so they end at 80 and 160 us. 100 us of products, then both
  // waits: the first is hidden, the second waits 60 us. Then a blocking one over m2 (20 us + 1000
  // bytes), exposed whole, and a send never waited for (a pipeline's), exposed whole.
  r.timeline.events = {event(K::started, ag, 1, 40000, 0), event(K::started, ag, 1, 40000, 1),
                       event(K::waited, ag, 1, 40000, 0, 100000), event(K::waited, ag, 1, 40000, 1),
                       event(K::blocking, mt::collective::allreduce, 2, 1000),
                       event(K::started, mt::collective::send, 0, 2000, 2)};
  const auto by = mt::communication_of(r, products_only());
  const auto& gathers = by.at({ag, mt::axis_set(1u)});
  CHECK(gathers.calls == 2);
  CHECK(gathers.bytes == 80000);
  CHECK(gathers.seconds == Catch::Approx(160e-6));
  CHECK(gathers.exposed == Catch::Approx(60e-6));
  const auto& reduce = by.at({mt::collective::allreduce, mt::axis_set(2u)});
  CHECK(reduce.exposed == Catch::Approx(21e-6));
  CHECK(reduce.seconds == Catch::Approx(21e-6));
  CHECK(by.at({mt::collective::send, mt::axis_set{}}).exposed == Catch::Approx(22e-6));

  const auto t = mt::predict(r, products_only());
  CHECK(t.communication == Catch::Approx(60e-6 + 21e-6 + 22e-6));
  CHECK(t.hidden == Catch::Approx(100e-6));
  CHECK_THAT(mt::communication_table(r, products_only()),
             Catch::Matchers::ContainsSubstring("allgather") && Catch::Matchers::ContainsSubstring("0.160") &&
                 Catch::Matchers::ContainsSubstring("0.060") && Catch::Matchers::ContainsSubstring("0.100"));

  // The same events, the work after both waits: nothing hides them.
  r.timeline.events[2].before = {};
  r.timeline.after.products.push_back({1000, 100000, false});
  CHECK(mt::communication_of(r, products_only()).at({ag, mt::axis_set(1u)}).exposed == Catch::Approx(160e-6));
}

TEST_CASE("a prefetched gather is hidden by the products between its start and its wait", "[planned]") {
  using LS = mt::layout<mesh2, mt::split<b, m1>>;  // the weight, stored split over m1
  using LW = mt::layout<mesh2>;                    // used whole
  using WS = mt::tensor<float, LS, a, b>;
  using W = mt::tensor<float, LW, a, b>;
  using X = mt::tensor<float, LW, c, a>;
  const auto pm = mesh2::planned({4, 2});
  const auto w = mt::zeros<WS>(pm, {100, 400});  // 100 x 100 floats here: a gather of 40000 bytes, 80 us
  const auto run = [&](std::int64_t rows, bool prefetched) {
    const auto x = mt::zeros<X>(pm, {rows, 100});
    mt::reset_plan(pm);
    if (prefetched) {
      auto moving = mt::start_gather_for_use<W>(w);
      (void)mt::einsum<c, d>(x, mt::zeros<mt::tensor<float, LW, a, d>>(pm, {100, 100}));  // 2 rows 100^2 FLOPs
      (void)moving.wait();
    } else {
      (void)mt::einsum<c, d>(x, mt::zeros<mt::tensor<float, LW, a, d>>(pm, {100, 100}));
      (void)mt::gather_for_use<W>(w);
    }
    return mt::predict(mt::plan_report_of(pm), products_only());
  };
  // 8 rows: 160 us of products, more than the gather's 80 us: all of it hidden.
  const auto hidden = run(8, true);
  CHECK(hidden.communication == Catch::Approx(0).margin(1e-12));
  CHECK(hidden.hidden == Catch::Approx(80e-6));
  CHECK(hidden.products == Catch::Approx(160e-6));
  // 2 rows: 40 us of products: 40 us of the gather left.
  CHECK(run(2, true).communication == Catch::Approx(40e-6));
  // Not started early: the same gather exposed whole, the same total cost.
  const auto blocking = run(8, false);
  CHECK(blocking.communication == Catch::Approx(80e-6));
  CHECK(blocking.hidden == 0);
}

// The replayed step drawn (timeline_picture): a gather over m1 started at 0 (80 us) under 100 us
// of products, then a blocking allreduce over m2 (20 us) that the work waits for: 120 us, 10 us a
// character.
TEST_CASE("the replayed step as a picture", "[planned]") {
  mt::plan_report r;
  r.shape = mt::mesh_shape({"m1", "m2"}, {4, 2});
  using K = mt::plan_event_kind;
  const auto ag = mt::collective::allgather;
  r.timeline.events = {event(K::started, ag, 1, 40000, 0), event(K::waited, ag, 1, 40000, 0, 100000),
                       event(K::blocking, mt::collective::allreduce, 2, 0)};
  CHECK(mt::timeline_picture(r, products_only(), 12) ==
        "timeline of the step, 0.120 ms across ('#' work, '.' waiting, '=' in flight):\n"
        "  work             |##########..|\n"
        "  m1               |========    |\n"
        "  m2               |          ==|\n");
}
