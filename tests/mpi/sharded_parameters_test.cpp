// Sharded parameters (ops/gather_for_use.hpp, optim/sharded.hpp): a weight stored split over the
// data axes and gathered for its use computes what the whole weight computes; its gradient arrives
// split, by one reduce_scatter over the batch's axes and no allreduce; it matches finite
// differences; the optimizers stepping on parts (stage 3: the stored parts; stage 1: the sharded
// wrapper on whole parameters) give the whole parameters' step, with the state split and the
// collectives their plans name. On [P], [2x2], [2x3] and [3x2] meshes, extents 7 x 5 x 6: uneven
// over 2, 3, 4 and 6 parts.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
constexpr std::int64_t I = 7, J = 5, K = 6;

// Data parallelism (i, the batch, over both axes; the weight [j, k] stored with j over them) and
// data x model parallelism (i over r, k over c; the weight's j stored over r).
using data = mt::layout<grid, mt::split<i_, r_, c_>>;
using data_shard = mt::layout<grid, mt::split<j_, r_, c_>>;
using two_d = mt::layout<grid, mt::split<i_, r_>, mt::split<k_, c_>>;
using two_d_shard = mt::layout<grid, mt::split<j_, r_>, mt::split<k_, c_>>;

std::int64_t calls_of_kind(const mt::comm_counters& c, mt::collective kind) {
  std::int64_t n = 0;
  for (const auto& [key, count] : c)
    if (key.first == kind) n += count.calls;
  return n;
}

template <class Compute, class Shard>
void check_gather_for_use(const grid& g) {
  INFO(layout_name<Compute>() << " stored as " << layout_name<Shard>());
  using X = ten<Compute, i_, j_>;
  using W = ten<Compute, j_, k_>;
  using WS = ten<Shard, j_, k_>;
  STATIC_REQUIRE(std::is_same_v<mt::with_layout_t<WS, Compute>, W>);
  const auto x = mt::random_normal<X>(g, {I, J}, 1);
  const auto loss_of = [&](const auto& w) { return weighted_sum(mt::einsum<i_, k_>(x, w), 2); };

  auto ws = mt::random_normal<WS>(g, {J, K}, 3);
  ws.requires_grad();
  auto w = mt::random_normal<W>(g, {J, K}, 3);  // the same values, whole
  w.requires_grad();

  g.reset_counters();
  const W used = mt::gather_for_use<W>(ws);
  REQUIRE(calls_of(g) == mt::gather_for_use_plan<W, WS>().as_counts());
  require_close(mt::gather_all(used), mt::gather_all(w), 0);

  const auto loss = loss_of(used);
  require_close(std::vector<double>{mt::item(loss)}, std::vector<double>{mt::item(loss_of(w))}, 1e-12);
  g.reset_counters();
  const auto [gs] = mt::gradient(loss, ws);
  const mt::comm_counters backward = g.counters();
  const std::int64_t scattered = bytes_of(g, mt::collective::reduce_scatter);
  const auto [gw] = mt::gradient(loss_of(w), w);
  require_close(mt::gather_all(gs), mt::gather_all(gw), 1e-12);
  REQUIRE(gs.local_extents() == ws.local_extents());
  // The batch's axes: the weight gradient's pending sum. Where they hold several processors, it
  // arrives by one reduce_scatter and never by an allreduce (ZeRO's gradient partitioning).
  constexpr unsigned batch_axes = mt::detail::axes_mask_of<X, mt::type_list<i_>>();
  INFO("backward: " << show(backward));
  REQUIRE(calls_of_kind(backward, mt::collective::allreduce) == 0);
  REQUIRE(calls_of_kind(backward, mt::collective::reduce_scatter) == 1);
  REQUIRE(backward.at({mt::collective::reduce_scatter, batch_axes}).calls == 1);
  if (g.communicator().size_over(batch_axes) > 1)
    REQUIRE(scattered == W(g, {J, K}).local_size() * 8);  // the whole gradient, once
  check_grad_at_normal<WS>("gather_for_use", g, {J, K}, 4,
                           [&](const WS& v) { return loss_of(mt::gather_for_use<W>(v)); });
}

// start_gather_for_use: two weights' gathers in flight while a product (with its own collectives)
// runs, then waited for: the same tensors as gather_for_use, the same collectives counted, the same
// gradients (one reduce_scatter each), and a planned mesh counts them alike.
template <class Compute, class Shard>
void check_started_gathers(const grid& g) {
  INFO("started: " << layout_name<Compute>() << " stored as " << layout_name<Shard>());
  using X = ten<Compute, i_, j_>;
  using W = ten<Compute, j_, k_>;
  using WS = ten<Shard, j_, k_>;
  const auto x = mt::random_normal<X>(g, {I, J}, 1);
  auto w1 = mt::random_normal<WS>(g, {J, K}, 3), w2 = mt::random_normal<WS>(g, {J, K}, 4);
  w1.requires_grad();
  w2.requires_grad();
  const auto loss_of = [&](const W& a, const W& b) {
    return weighted_sum(mt::einsum<i_, k_>(x, a) + mt::einsum<i_, k_>(x, b), 2);
  };
  g.reset_counters();
  const W a = mt::gather_for_use<W>(w1), b = mt::gather_for_use<W>(w2);
  const mt::comm_counters blocking = g.counters();
  g.reset_counters();
  (void)mt::einsum<i_, k_>(x, a);
  const mt::comm_counters product = g.counters();
  const auto want = loss_of(a, b);
  const auto [want1, want2] = mt::gradient(want, w1, w2);

  g.reset_counters();
  auto first = mt::start_gather_for_use<W>(w1);
  auto second = mt::start_gather_for_use<W>(w2);
  const auto between = mt::einsum<i_, k_>(x, a);  // collectives of its own while both are in flight
  const W a2 = first.wait(), b2 = second.wait();
  mt::comm_counters started = g.counters();
  for (const auto& [key, n] : product) {
    auto& c = started[key];
    c.calls -= n.calls;  // the product between, and nothing else
    c.bytes -= n.bytes;
  }
  std::erase_if(started, [](const auto& kv) { return kv.second.calls == 0 && kv.second.bytes == 0; });
  INFO("blocking " << show(blocking) << " started " << show(started));
  REQUIRE(started == blocking);
  require_close(mt::gather_all(a2), mt::gather_all(a), 0);
  require_close(mt::gather_all(b2), mt::gather_all(b), 0);
  const auto loss = loss_of(a2, b2);
  require_close(std::vector<double>{mt::item(loss)}, std::vector<double>{mt::item(want)}, 0);
  g.reset_counters();
  const auto [got1, got2] = mt::gradient(loss, w1, w2);
  REQUIRE(calls_of_kind(g.counters(), mt::collective::allreduce) == 0);
  REQUIRE(calls_of_kind(g.counters(), mt::collective::reduce_scatter) == 2);
  require_close(mt::gather_all(got1), mt::gather_all(want1), 1e-12);
  require_close(mt::gather_all(got2), mt::gather_all(want2), 1e-12);
  REQUIRE_THROWS_WITH(first.wait(), Catch::Matchers::ContainsSubstring("waited for twice"));
  // Planned: the same counts as the real gather.
  const grid planned = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
  {
    const auto pw = mt::random_normal<WS>(planned, {J, K}, 3);
    planned.reset_counters();
    auto in_flight = mt::start_gather_for_use<W>(pw);
    (void)in_flight.wait();
    REQUIRE(calls_of(planned) == mt::gather_for_use_plan<W, WS>().as_counts());
    mt::comm_counters one = blocking;  // two gathers of one shape: half of them each
    for (auto& [key, n] : one) n.calls /= 2, n.bytes /= 2;
    REQUIRE(planned.counters() == one);
  }
}

// Under gradient_reduction's overlap the weights' reduce_scatters start nonblocking as the pass
// makes them and land before gradient() hands the gradients out: the same collectives counted as
// blocking, the same gradients (in double; with W's bf16 working copies of float weights, cast
// before the gather, the sum is made in float and lands in the float weight's gradient without
// the blocking path's rounding to bf16 on the way: equal to bf16's precision), and in a plan each
// is started, the other weight's product runs while the first is in flight, and both are waited
// for at the end.
template <class Compute, class Shard, class Work>
void check_overlapped_scatters(const grid& g) {
  INFO("overlapped: " << layout_name<Compute>() << " stored as " << layout_name<Shard>() << ", products in "
                      << (std::is_same_v<Work, mt::bf16> ? "bf16" : "double"));
  using Stored = std::conditional_t<std::is_same_v<Work, mt::bf16>, float, double>;
  using X = mt::basic_tensor<Work, Compute, Kokkos::DefaultExecutionSpace, i_, j_>;
  using WS = mt::basic_tensor<Stored, Shard, Kokkos::DefaultExecutionSpace, j_, k_>;
  const auto step = [](const grid& on, bool overlap, int sums_in_flight = 2) {
    const mt::gradient_reduction defaults = mt::gradient_reduction_settings();
    mt::gradient_reduction r = defaults;
    r.overlap = overlap;
    r.sums_in_flight = sums_in_flight;
    mt::set_gradient_reduction(r);
    const auto x = mt::cast<Work>(mt::random_normal<typename X::template rebind<double>>(on, {I, J}, 1));
    auto w1 = mt::random_normal<WS>(on, {J, K}, 3), w2 = mt::random_normal<WS>(on, {J, K}, 4);
    w1.requires_grad();
    w2.requires_grad();
    on.reset_counters();
    if (on.is_planned()) mt::reset_plan(on);
    const auto product = [&](const WS& w) { return mt::einsum<i_, k_>(x, mt::use_as<Work, Compute>(w)); };
    const auto loss = weighted_sum(mt::cast<double>(product(w1) + product(w2)), 2);
    auto grads = mt::gradient(loss, w1, w2);
    mt::set_gradient_reduction(defaults);
    return std::make_pair(on.counters(), std::move(grads));
  };
  const double tolerance = std::is_same_v<Work, mt::bf16> ? 1e-2 : 1e-12;
  const auto [blocking, want] = step(g, false);
  const auto [overlapped, got] = step(g, true);
  INFO("blocking " << show(blocking) << " overlapped " << show(overlapped));
  REQUIRE(overlapped == blocking);
  require_close(mt::gather_all(std::get<0>(got)), mt::gather_all(std::get<0>(want)), tolerance);
  require_close(mt::gather_all(std::get<1>(got)), mt::gather_all(std::get<1>(want)), tolerance);

  // The plan's order: where each sum starts and where it is waited for.
  const auto planned_sums = [&](int sums_in_flight) {
    const grid planned = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
    (void)step(planned, true, sums_in_flight);
    const auto events = mt::plan_report_of(planned).timeline.events;
    std::vector<std::size_t> started, waited;
    for (std::size_t e = 0; e < events.size(); ++e) {
      if (events[e].op != mt::collective::reduce_scatter) continue;
      REQUIRE(events[e].kind != mt::plan_event_kind::blocking);
      (events[e].kind == mt::plan_event_kind::started ? started : waited).push_back(e);
    }
    REQUIRE(started.size() == 2);
    REQUIRE(waited.size() == 2);
    return std::make_tuple(events, started, waited);
  };
  {
    const auto [events, started, waited] = planned_sums(2);
    REQUIRE(started[1] < waited[0]);  // both in flight at once
    // The first weight's product (its gradient) is computed while the second's sum is in flight.
    REQUIRE(!events[started[1]].before.products.empty());
  }
  {
    // One in flight at a time: the second waits for the first before it starts.
    const auto [events, started, waited] = planned_sums(1);
    REQUIRE(started[0] < waited[0]);
    REQUIRE(waited[0] < started[1]);
  }
}

// An optimizer stepping on parts gives the whole parameter's step: three steps of Inner on a
// whole parameter, of Inner on the parameter stored as parts (stage 3: the gradient given as
// parts), and of sharded<Inner, Shard> on a whole parameter (stage 1).
template <class Compute, class Shard, class Inner>
void check_steps(const grid& g, const Inner& inner, const char* name) {
  INFO(name << ": " << layout_name<Compute>() << " stored as " << layout_name<Shard>());
  using W = ten<Compute, j_, k_>;
  using WS = ten<Shard, j_, k_>;
  auto whole = mt::random_normal<W>(g, {J, K}, 5);
  auto parts = mt::random_normal<WS>(g, {J, K}, 5);
  auto stage1 = mt::random_normal<W>(g, {J, K}, 5);
  Inner plain = inner, on_parts = inner;
  mt::optim::sharded<Inner, Shard> sharded(inner);
  for (std::uint64_t t = 0; t < 3; ++t) {
    const auto grad = mt::random_normal<W>(g, {J, K}, 10 + t);
    plain.step(std::tie(whole), std::make_tuple(grad));
    on_parts.step(std::tie(parts), std::make_tuple(mt::relayout<WS>(grad)));
    g.reset_counters();
    sharded.step(std::tie(stage1), std::make_tuple(grad));
    // One allgather of the updated parts (plus whatever Inner itself communicates on the parts).
    const auto counted = g.counters();
    const auto gather = mt::relayout_plan<W, WS>().as_counts();
    for (const auto& [key, count] : gather) REQUIRE(counted.at(key).calls >= count.calls);
  }
  require_close(mt::gather_all(parts), mt::gather_all(whole), 1e-12);
  require_close(mt::gather_all(stage1), mt::gather_all(whole), 1e-12);
  // The state is split: each processor holds the state of its part only.
  REQUIRE(sharded.state_bytes(std::tie(stage1)) == on_parts.state_bytes(std::tie(parts)));
  const auto part_size = WS(g, {J, K}).local_size(), whole_size = W(g, {J, K}).local_size();
  if (part_size < whole_size) REQUIRE(sharded.state_bytes(std::tie(stage1)) < plain.state_bytes(std::tie(whole)));
  // The ledger's updated elements: the part.
  REQUIRE(mt::optim::sharded<Inner, Shard>::updated_size(stage1) == part_size);
}

template <class Compute, class Shard>
void check_optimizers(const grid& g) {
  check_steps<Compute, Shard>(g, mt::optim::sgd({.lr = 0.1, .momentum = 0.9}), "sgd");
  check_steps<Compute, Shard>(g, mt::optim::adam({.lr = 0.01}), "adam");
  check_steps<Compute, Shard>(g, mt::optim::adafactor({.lr = 0.01}), "adafactor");
}

}  // namespace

TEST_CASE("gather_for_use: the whole weight's result; its gradient split by one reduce_scatter") {
  const grid g = world_grid();
  check_gather_for_use<data, data_shard>(g);
  check_gather_for_use<two_d, two_d_shard>(g);
  if (world_size() == 6) {
    const grid g32(MPI_COMM_WORLD, {3, 2});
    check_gather_for_use<data, data_shard>(g32);
    check_gather_for_use<two_d, two_d_shard>(g32);
  }
}

TEST_CASE("start_gather_for_use: in flight while other collectives run, then as gather_for_use") {
  const grid g = world_grid();
  check_started_gathers<data, data_shard>(g);
  check_started_gathers<two_d, two_d_shard>(g);
}

TEST_CASE("gather_for_use's reduce_scatters behind the backward pass (gradient_reduction::overlap)") {
  const grid g = world_grid();
  check_overlapped_scatters<data, data_shard, double>(g);
  check_overlapped_scatters<two_d, two_d_shard, double>(g);
  check_overlapped_scatters<data, data_shard, mt::bf16>(g);
  CHECK_THROWS_WITH(mt::set_gradient_reduction({.overlap = true, .sums_in_flight = 0}),
                    Catch::Matchers::ContainsSubstring("sums_in_flight 0 must be at least 1"));
}

TEST_CASE("optimizers on parts (stages 1 and 3) step as on the whole parameter, state split") {
  const grid g = world_grid();
  check_optimizers<data, data_shard>(g);
  check_optimizers<two_d, two_d_shard>(g);
}
