// The communication of the reductions (reduce_mean, max, min, logsumexp), softmax, rename, reshape and cast at 1, 2 and 4 ranks. For every layout of the sweeps, the collectives an op
// calls (counted per collective and axis set by the mesh) equal its constexpr plan. The plans of
// chosen cases equal hand-written expectations (alltoall when a split moves between dims,
// allgather when it stops, nothing when it only refines), and bytes are checked by hand from local
// sizes for a few. relayout between every pair of layouts is plan-checked in
// relayout_equivalence_test, where those pairs are instantiated anyway.
// Kokkos::DefaultExecutionSpace only: communication does not depend on the space.
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
const std::array<std::int64_t, 2> ext{8, 12};

// Calls only, as written by hand: {collective, axes mask, calls}.
struct expected_call {
  mt::collective kind;
  unsigned axes;
  std::int64_t calls;
};
mt::comm_counters counts(std::initializer_list<expected_call> calls) {
  mt::comm_counters c;
  for (const auto& e : calls) c[{e.kind, e.axes}].calls = e.calls;
  return c;
}

// Runs op(x) with fresh counters and compares them with plan.
template <class M, class X, class F>
void plan_matches(const M& m, const X& x, F op, const mt::comm_plan& plan) {
  m.reset_counters();
  (void)op(x);
  require_counts(m.counters(), plan.as_counts());
}

template <class M, class L>
void check_layout(const M& m) {
  using X = ten<L, i_, j_>;
  using Xr = ten<mt::layout<M>, i_, j_>;
  INFO(layout_name<L>());
  const auto x = mt::random_normal<X>(m, ext, 3);
  // constexpr: each plan is a function of the types alone.
  constexpr auto mean_j = mt::reduce_mean_plan<X, j_>();
  constexpr auto mean_ij = mt::reduce_mean_plan<X, i_, j_>();
  constexpr auto max_i = mt::reduce_max_plan<X, i_>();
  constexpr auto min_j = mt::reduce_min_plan<X, j_>();
  constexpr auto lse_j = mt::logsumexp_plan<X, j_>();
  constexpr auto softmax_i = mt::softmax_plan<X, i_>();
  constexpr auto log_softmax_j = mt::log_softmax_plan<X, j_>();
  constexpr auto causal_j = mt::causal_softmax_plan<X, i_, j_>();
  constexpr auto cast_f = mt::cast_plan<float, X>();
  constexpr auto rename_jl = mt::rename_plan<X, j_, l_>();
  constexpr auto swap = mt::replace_dimensions_plan<X, list<i_, j_>, list<j_, i_>>();
  constexpr auto flat = mt::reshape_plan<mt::detail::with_dims_t<X, list<l_>>, X>();
  constexpr auto split_j = mt::reshape_plan<mt::detail::with_dims_t<X, list<i_, l_, m_>>, X>();
  plan_matches(m, x, [](const auto& t) { return mt::reduce_mean<j_>(t); }, mean_j);
  plan_matches(m, x, [](const auto& t) { return mt::reduce_mean<i_, j_>(t); }, mean_ij);
  plan_matches(m, x, [](const auto& t) { return mt::reduce_max<i_>(t); }, max_i);
  plan_matches(m, x, [](const auto& t) { return mt::reduce_min<j_>(t); }, min_j);
  plan_matches(m, x, [](const auto& t) { return mt::logsumexp<j_>(t); }, lse_j);
  plan_matches(m, x, [](const auto& t) { return mt::softmax<i_>(t); }, softmax_i);
  plan_matches(m, x, [](const auto& t) { return mt::causal_softmax<i_, j_>(t, 0.5); }, causal_j);
  plan_matches(m, x, [](const auto& t) { return mt::log_softmax<j_>(t); }, log_softmax_j);
  plan_matches(m, x, [](const auto& t) { return mt::cast<float>(t); }, cast_f);
  plan_matches(m, x, [](const auto& t) { return mt::stop_gradient(t); }, mt::stop_gradient_plan<X>());
  plan_matches(m, x, [](const auto& t) { return mt::rename<j_, l_>(t); }, rename_jl);
  plan_matches(m, x, [](const auto& t) { return mt::replace_dimensions<list<i_, j_>, list<j_, i_>>(t); }, swap);
  plan_matches(m, x, [](const auto& t) { return mt::reshape<l_>(t, {96}); }, flat);
  plan_matches(m, x, [](const auto& t) { return mt::reshape<i_, l_, m_>(t, {8, 4, 3}); }, split_j);
  // relayout to and from the replicated layout.
  plan_matches(m, x, [](const auto& t) { return mt::relayout<Xr>(t); }, mt::relayout_plan<Xr, X>());
  const auto xr = mt::random_normal<Xr>(m, ext, 3);
  plan_matches(m, xr, [](const auto& t) { return mt::relayout<X>(t); }, mt::relayout_plan<X, Xr>());

  // Independent of the plan functions: the reductions allreduce over exactly the axes of the
  // reduced dims that L splits; a replicated target needs one allgather over every split axis.
  const unsigned ai = L::template split_of<i_>().mask(), aj = L::template split_of<j_>().mask();
  REQUIRE(mean_j.as_counts() == (aj ? counts({{mt::collective::allreduce, aj, 1}}) : counts({})));
  REQUIRE(lse_j.as_counts() == (aj ? counts({{mt::collective::allreduce, aj, 2}}) : counts({})));
  REQUIRE(mean_ij.as_counts() == (ai | aj ? counts({{mt::collective::allreduce, ai | aj, 1}}) : counts({})));
  REQUIRE(mt::relayout_plan<Xr, X>().as_counts() ==
          (ai | aj ? counts({{mt::collective::allgather, ai | aj, 1}}) : counts({})));
  REQUIRE(mt::relayout_plan<X, Xr>().empty());  // slicing only
  REQUIRE(cast_f.empty());
}
}  // namespace

TEST_CASE("reductions, softmax, renames and reshapes call exactly the collectives of their plans, every layout", "[reduction_softmax_reshape][comm_plan]") {
  SECTION("mesh [P]") {
    auto m = world_line();
    for_each_type(line_layouts<line, i_, j_, l_>{}, [&]<class L>() { check_layout<line, L>(m); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto m = world_grid();
    for_each_type(grid_layouts<i_, j_, l_>{}, [&]<class L>() { check_layout<grid, L>(m); });
  }
}

TEST_CASE("relayout plans: alltoall when a split moves, allgather when it stops, nothing when it refines",
          "[reduction_softmax_reshape][comm_plan]") {
  auto m = world_grid();
  const unsigned r = grid::mask<r_>(), c = grid::mask<c_>();
  using mt::collective;
  using mt::layout;
  using mt::split;
  // One case: relayout from layout A to layout B of tensor<i, j>, with the expected calls.
  auto check = [&]<class A, class B>(mt::comm_counters want) {
    using TA = ten<A, i_, j_>;
    using TB = ten<B, i_, j_>;
    INFO(layout_name<A>() << " -> " << layout_name<B>());
    constexpr auto plan = mt::relayout_plan<TB, TA>();
    REQUIRE(plan.as_counts() == want);
    const auto a = mt::random_normal<TA>(m, ext, 9);
    m.reset_counters();
    const auto b = mt::relayout<TB>(a);
    require_counts(m.counters(), want);
    // Bytes: each collective sends this processor's whole slice once.
    for (const auto& [k, v] : m.counters()) REQUIRE(v.bytes == a.local_size() * std::int64_t(sizeof(double)));
  };
  check.operator()<layout<grid, split<i_, r_>>, layout<grid, split<j_, r_>>>(counts({{collective::alltoall, r, 1}}));
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<i_, r_>, split<j_, c_>>>(
      counts({{collective::alltoall, c, 1}}));
  check.operator()<layout<grid, split<i_, c_>, split<j_, r_>>, layout<grid, split<j_, r_, c_>>>(
      counts({{collective::alltoall, c, 1}}));
  // A split over both axes moving between dims, in either order: one alltoall over both.
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<j_, r_, c_>>>(
      counts({{collective::alltoall, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<j_, c_, r_>>>(
      counts({{collective::alltoall, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<j_, c_, r_>>>(
      counts({{collective::alltoall, r, 1}}));
  check.operator()<layout<grid, split<i_, r_>>, layout<grid, split<i_, r_, c_>>>(counts({}));
  check.operator()<layout<grid>, layout<grid, split<i_, c_>, split<j_, r_>>>(counts({}));
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<i_, r_>>>(counts({{collective::allgather, c, 1}}));
  check.operator()<layout<grid, split<i_, c_, r_>>, layout<grid, split<i_, r_, c_>>>(
      counts({{collective::allgather, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<i_, c_>, split<j_, r_>>>(
      counts({{collective::allgather, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<i_, r_>, split<j_, c_>, split<k_, r_>>>(
      counts({}));
}

TEST_CASE("rename and reshape plans, by hand; bytes of reductions and reshape from local sizes",
          "[reduction_softmax_reshape][comm_plan]") {
  auto m = world_grid();
  const unsigned r = grid::mask<r_>(), c = grid::mask<c_>();
  using mt::collective;
  using mt::layout;
  using mt::split;
  SECTION("rename: the new dim split like the old one moves nothing; otherwise data moves") {
    using Same = ten<layout<grid, split<j_, r_>, split<l_, r_>>, i_, j_>;
    using Other = ten<layout<grid, split<j_, r_>, split<l_, c_>>, i_, j_>;
    using Unsplit = ten<layout<grid, split<j_, r_>>, i_, j_>;
    using Swap = ten<layout<grid, split<i_, r_>>, i_, j_>;
    REQUIRE(mt::rename_plan<Same, j_, l_>().empty());
    REQUIRE(mt::rename_plan<Other, j_, l_>().as_counts() == counts({{collective::allgather, r, 1}}));
    REQUIRE(mt::rename_plan<Unsplit, j_, l_>().as_counts() == counts({{collective::allgather, r, 1}}));
    // (i, j) -> (j, i): the split on r moves from position 0 to position 1.
    REQUIRE(mt::replace_dimensions_plan<Swap, list<i_, j_>, list<j_, i_>>().as_counts() ==
            counts({{collective::alltoall, r, 1}}));
    const auto x = mt::random_normal<Same>(m, ext, 1);
    m.reset_counters();
    const auto y = mt::rename<j_, l_>(x);
    REQUIRE(m.counters().empty());
    REQUIRE(y.view().data() == x.view().data());  // the same slice, not even copied
  }
  SECTION("reshape: gathers the split dims it drops, keeps the ones it keeps") {
    using X = ten<layout<grid, split<i_, r_>, split<j_, c_>>, i_, j_>;
    using Keep = mt::detail::with_dims_t<X, list<i_, l_, m_>>;
    REQUIRE(mt::reshape_plan<Keep, X>().as_counts() == counts({{collective::allgather, c, 1}}));
    const auto x = mt::random_normal<X>(m, ext, 1);
    m.reset_counters();
    (void)mt::reshape<l_>(x, {96});
    const auto& got = m.counters();
    REQUIRE(got.size() == 1);
    REQUIRE(got.at({collective::allgather, r | c}).calls == 1);
    REQUIRE(got.at({collective::allgather, r | c}).bytes == x.local_size() * 8);
  }
  SECTION("reductions: one allreduce of the result's local slice; logsumexp two") {
    using X = ten<layout<grid, split<i_, r_>, split<j_, c_>>, i_, j_>;
    const auto x = mt::random_normal<X>(m, ext, 1);
    m.reset_counters();
    const auto mean = mt::reduce_mean<j_>(x);
    REQUIRE(m.counters().size() == 1);
    REQUIRE(m.counters().at({collective::allreduce, c}).bytes == mean.local_size() * 8);
    REQUIRE(mean.local_size() == x.local_extent<i_>());
    m.reset_counters();
    (void)mt::logsumexp<i_, j_>(x);
    REQUIRE(m.counters().size() == 1);
    REQUIRE(m.counters().at({collective::allreduce, r | c}).calls == 2);
    REQUIRE(m.counters().at({collective::allreduce, r | c}).bytes == 2 * 8);  // a scalar, twice
    m.reset_counters();
    (void)mt::softmax<i_>(x);
    REQUIRE(m.counters().at({collective::allreduce, r}).calls == 2);
    REQUIRE(m.counters().at({collective::allreduce, r}).bytes == 2 * x.local_extent<j_>() * 8);
  }
}
