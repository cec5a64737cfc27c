// The communication of the reductions (reduce_mean, max, min, logsumexp), softmax, cast, rename,
// reshape and relayout to and from the replicated layout (a TU of mpi_reductions_test): for every
// layout of the sweeps, the collectives an op calls (counted per collective and axis set by the
// mesh) equal its constexpr plan, and the reductions' and relayouts' plans equal the axes of the
// dims they reduce or gather. Hand-written plans: rename and reshape in reshape_test.cpp, relayout
// in relayout_equivalence_test.cpp.
// Kokkos::DefaultExecutionSpace only: communication does not depend on the space.
#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;

namespace {
const std::array<std::int64_t, 2> ext{8, 12};

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

TEST_CASE("reductions, softmax, renames and reshapes call exactly the collectives of their plans, every layout", "[softmax][comm_plan]") {
  SECTION("mesh [P]") {
    auto m = world_line();
    for_each_type(line_layouts<line, i_, j_, l_>{}, [&]<class L>() { check_layout<line, L>(m); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto m = world_grid();
    for_each_type(grid_layouts<i_, j_, l_>{}, [&]<class L>() { check_layout<grid, L>(m); });
  }
}
