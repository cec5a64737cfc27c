// The collectives that elementwise ops, reduce_sum and einsum run equal their static plans, for
// every layout of meshes [P] and [2x2]; bytes are checked by hand for einsum.
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
const std::array<std::int64_t, 3> ext{4, 8, 12};

template <class M>
void require_counts(const M& g, const mt::comm_plan& plan) {
  mt::comm_counters calls;
  for (const auto& [key, count] : g.counters()) calls[key].calls = count.calls;
  REQUIRE(calls == plan.as_counts());
}

template <class M, class Layouts>
void run_all(const M& g, Layouts layouts) {
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    using IJ = mt::tensor<double, L, i_, j_>;
    using JK = mt::tensor<double, L, j_, k_>;
    using IJK = mt::tensor<double, L, i_, j_, k_>;
    auto a = mt::random_normal<IJ>(g, {ext[0], ext[1]}, 1);
    auto b = mt::random_normal<JK>(g, {ext[1], ext[2]}, 2);
    auto x = mt::random_normal<IJK>(g, ext, 3);

    g.reset_counters();
    auto y = mt::exp(a) * b + a;
    require_counts(g, mt::comm_plan{});  // elementwise: nothing

    g.reset_counters();
    auto s = mt::reduce_sum<j_>(x);
    require_counts(g, mt::reduce_plan<decltype(s), IJK>());

    g.reset_counters();
    auto c = mt::einsum<i_, k_>(a, b);
    constexpr auto plan = mt::einsum_plan<list<i_, k_>, IJ, JK>();
    require_counts(g, plan);
    // j is contracted: when split, one allreduce over its axes moving the local block of c.
    constexpr unsigned j_axes = L::template split_of<j_>().mask();
    STATIC_REQUIRE((plan.size == 1) == (j_axes != 0));
    if constexpr (j_axes != 0) {
      const auto& count = g.counters().at({mt::collective::allreduce, j_axes});
      REQUIRE(count.bytes == c.local_size() * std::int64_t(sizeof(double)));
    }

    g.reset_counters();
    auto k_only = mt::einsum<k_>(a, b);  // i summed in a first, then j contracted
    require_counts(g, mt::einsum_plan<list<k_>, IJ, JK>());
    (void)y;
    (void)k_only;
  });
}
}  // namespace

TEST_CASE("elementwise, reduce_sum and einsum communicate exactly their plan", "[comm_plan]") {
  SECTION("mesh [P]") { run_all(world_line(), line_layouts<line, i_, j_, k_>{}); }
  SECTION("mesh [2x2]") { run_all(world_grid(), grid_layouts<i_, j_, k_>{}); }
}

TEST_CASE("collectives count calls and bytes per axis set", "[comm_plan]") {
  auto g = world_grid();
  auto& comm = g.communicator();
  g.reset_counters();
  std::vector<double> v(10, 1.0);
  mt::allreduce(comm, grid::mask<r_>(), v.data(), 10);
  mt::allreduce(comm, grid::mask<r_>(), v.data(), 10, mt::reduce_op::max);
  REQUIRE(v[0] == double(g.size<r_>()));
  std::vector<double> all(10 * g.nprocs());
  mt::allgather(comm, grid::mask<r_, c_>(), v.data(), 10, all.data());
  const auto& counters = g.counters();
  REQUIRE(counters.at({mt::collective::allreduce, grid::mask<r_>()}) == mt::comm_count{2, 160});
  REQUIRE(counters.at({mt::collective::allgather, grid::mask<r_, c_>()}) == mt::comm_count{1, 80});
  REQUIRE(counters.size() == 2);
}

TEST_CASE("collectives move the right data", "[comm_plan]") {
  auto g = world_grid();
  auto& comm = g.communicator();
  const int p = g.nprocs(), me = g.rank();
  // allgather in sub-communicator order: rank order over (r, c), last axis fastest.
  std::vector<int> mine{me}, all(p);
  mt::allgather(comm, grid::mask<r_, c_>(), mine.data(), 1, all.data());
  for (int q = 0; q < p; ++q) REQUIRE(all[q] == q);
  // alltoall: block q goes to rank q.
  std::vector<int> send(p), recv(p);
  for (int q = 0; q < p; ++q) send[q] = me * 100 + q;
  mt::alltoall(comm, grid::mask<r_, c_>(), send.data(), 1, recv.data());
  for (int q = 0; q < p; ++q) REQUIRE(recv[q] == q * 100 + me);
  // reduce_scatter: each rank gets the sum of its block.
  std::vector<double> rs(p, 1.0), out(1);
  mt::reduce_scatter(comm, grid::mask<r_, c_>(), rs.data(), out.data(), 1);
  REQUIRE(out[0] == double(p));
  // shift along r by +1 with wrap: receive from the processor above.
  const int rsize = g.size<r_>(), rc = g.coord<r_>();
  std::vector<int> s{rc}, rcv{-1};
  mt::shift(comm, 0, s.data(), rcv.data(), 1, 1, true);
  REQUIRE(rcv[0] == (rc - 1 + rsize) % rsize);
  mt::shift(comm, 0, s.data(), rcv.data(), 1, 1, false);
  REQUIRE(rcv[0] == (rc == 0 ? 0 : rc - 1));
  // broadcast from sub-rank 0 along c.
  std::vector<int> bc{g.coord<c_>() + 7};
  mt::broadcast(comm, grid::mask<c_>(), bc.data(), 1, 0);
  REQUIRE(bc[0] == 7);
}

// The door every op goes through (ops/detail/op_call.hpp) compares what an op ran with the plan its
// step states where plans are checked (the suite sets MESHTENSOR_CHECK_PLANS): a stand-in op that
// runs reduce_sum under a step stating another plan fails, naming itself, what it ran and its plan;
// stating reduce_sum's plan it passes; a composite step checks nothing.
TEST_CASE("an op whose step states another plan than it runs fails where plans are checked", "[comm_plan]") {
  using L = mt::layout<grid, mt::split<i_, r_>>;
  using X = mt::tensor<double, L, i_, j_>;
  const auto g = world_grid();
  const auto x = mt::random_normal<X>(g, {4, 6}, 1);
  bool& checked = mt::detail::plans_checked_switch();
  const bool before = checked;
  checked = true;
  const auto stand_in = [&](mt::comm_plan stated) {
    const mt::detail::op_call call(mt::detail::planned_step{"stand_in", stated}, x);
    return mt::reduce_sum<i_>(x);
  };
  CHECK_THROWS_WITH(stand_in(mt::comm_plan{}),
                    Catch::Matchers::ContainsSubstring("stand_in ran 1 x allreduce over r") &&
                        Catch::Matchers::ContainsSubstring("but its plan says no collective"));
  CHECK_THROWS_WITH(stand_in(mt::comm_plan{}.then(mt::collective::allgather, 1u)),
                    Catch::Matchers::ContainsSubstring("its plan says 1 x allgather over r"));
  CHECK_NOTHROW(stand_in(mt::reduce_plan<mt::tensor<double, L, j_>, X>()));
  CHECK_NOTHROW([&] {
    const mt::detail::op_call call(mt::detail::composite_step{"layer"});
    return mt::reduce_sum<i_>(x);
  }());
  // Unchecked, the drifting step passes unnoticed: the suite's setting is what catches it.
  checked = false;
  CHECK_NOTHROW(stand_in(mt::comm_plan{}));
  checked = before;
}
