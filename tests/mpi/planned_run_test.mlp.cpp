// Planned against real: the Transformer step under 2-D layouts, the MLP step, a mesh of 512
// processors planned without MPI (a TU of mpi_planned_run_test: see planned_run.hpp).
#include <catch2/matchers/catch_matchers_string.hpp>

#include "planned_run.hpp"

using namespace tst;
using namespace tst::planned_run;

using transformer_2d_layouts =
    list<mt::layout<grid, mt::split<batch, r_>, mt::split<vocab, c_>, mt::split<heads, c_>, mt::split<d_ff, c_>>,
         mt::layout<grid, mt::split<batch, c_>, mt::split<d_model, r_>>>;

TEST_CASE("a planned Transformer step counts what the real one sends, 2-D layouts", "[planned]") {
  const auto g = world_grid();
  for_each_type(transformer_2d_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    check_planned_equals_real(g, [](const grid& m) { return transformer_step<L>(m); });
  });
}

// Six of the 19 layouts of the 2-D mesh over (batch, hidden): each kind of split once (none, one
// axis, both axes in either order, both dims), not all 19, for compile time; the examples' three
// layouts each are checked by their --check-plan tests.
using mlp_layouts = list<mt::layout<grid>, mt::layout<grid, mt::split<batch, r_>>, mt::layout<grid, mt::split<hidden, c_>>,
                         mt::layout<grid, mt::split<batch, r_, c_>>, mt::layout<grid, mt::split<hidden, c_, r_>>,
                         mt::layout<grid, mt::split<batch, c_>, mt::split<hidden, r_>>>;

TEST_CASE("a planned MLP step counts what the real one sends", "[planned]") {
  const auto g = world_grid();
  for_each_type(mlp_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    check_planned_equals_real(g, [](const grid& m) { return mlp_step<L>(m); });
  });
}

TEST_CASE("a planned mesh of 512 processors plans without MPI", "[planned]") {
  using L = mt::layout<grid, mt::split<batch, r_>, mt::split<hidden, c_>>;
  const auto pm = grid::planned({16, 32}, {3, 31});
  REQUIRE(pm.is_planned());
  REQUIRE(pm.nprocs() == 512);
  REQUIRE(pm.rank() == 3 * 32 + 31);
  const auto x = mt::random_normal<mt::tensor<float, L, batch, hidden>>(pm, {160, 100}, 1);
  // 100 over 32: the first 4 parts hold 4, the others 3; coordinate 31 holds 3.
  CHECK(x.local_extent<hidden>() == 3);
  CHECK(x.local_extent<batch>() == 10);
  mt::reset_plan(pm);
  const auto s = mt::reduce_sum<hidden>(x);  // [batch]: an allreduce of 10 floats over c
  const auto r = mt::plan_report_of(pm);
  REQUIRE(r.collectives.size() == 1);
  CHECK(r.collectives[0].op == "reduce_sum");
  CHECK(r.collectives[0].collective == "allreduce");
  CHECK(r.collectives[0].axes == "c");
  CHECK(r.collectives[0].bytes == 10 * 4);
  CHECK(r.peak_bytes == (10 * 3 + 10) * 4);
  CHECK(r.json().find("\"op\": \"reduce_sum\"") != std::string::npos);
  mt::reset_plan(pm);
  (void)mt::einsum<batch>(x, x);  // 10 local rows, 3 products each: 2 * 10 * 3 FLOPs, then an allreduce
  const auto e = mt::plan_report_of(pm);
  CHECK(e.total_flops == 2 * 10 * 3);
  REQUIRE(e.flops.size() == 1);
  CHECK(e.flops[0].op == "einsum");
  // scatter planned for a processor other than the root: it passes an empty span, as a real one does.
  using T = mt::tensor<float, L, batch, hidden>;
  CHECK_NOTHROW(mt::scatter<T>(pm, {160, 100}, std::span<const float>{}));
  const std::vector<float> too_short(7);
  CHECK_THROWS_WITH(mt::scatter<T>(pm, {160, 100}, too_short),
                    Catch::Matchers::ContainsSubstring("scatter: the host array has 7 elements, but tensor<batch, hidden>[batch=160, hidden=100] has 16000"));
  CHECK_THROWS_WITH(grid::planned({16, 32}, {16, 0}), Catch::Matchers::ContainsSubstring("coordinate 16 is outside axis 'r' of size 16"));
  // Real work while a planned mesh exists would run no kernel: refused, naming the tensor.
  const auto g = world_grid();
  CHECK_THROWS_WITH((mt::zeros<mt::tensor<float, L, batch, hidden>>(g, {4, 4})),
                    Catch::Matchers::ContainsSubstring("tensor<batch, hidden>: made on a real mesh while a planned mesh exists"));
}

// rename, replace_dimensions and reshape relayout (here: allgather the split dim they rename or
// flatten), sum_to allreduces; their collectives, forward and backward, are named after them in a
// plan, not "other".
TEST_CASE("rename, replace_dimensions, reshape and sum_to name their collectives in a plan", "[planned]") {
  using L = mt::layout<grid, mt::split<batch, r_>>;
  using X = mt::tensor<float, L, batch, hidden>;
  const auto pm = grid::planned({2, 2}, {1, 0});
  auto x = mt::random_normal<X>(pm, {6, 4}, 1);
  x.requires_grad();
  const auto ops_of = [&](auto&& f, const std::string& name) {
    mt::reset_plan(pm);
    const auto y = f(x);
    (void)mt::gradient(sum_all(y), x);
    const auto r = mt::plan_report_of(pm);
    INFO(name);
    std::size_t named = 0;
    for (const auto& c : r.collectives) {
      INFO("collective " << c.collective << " credited to '" << c.op << "'");
      // The op's own, forward and backward; the loss's reduce_sum is the test's.
      CHECK((c.op.rfind(name, 0) == 0 || c.op.rfind("reduce_sum", 0) == 0));
      named += c.op.rfind(name, 0) == 0;
    }
    CHECK(named > 0);
  };
  ops_of([](const X& t) { return mt::rename<batch, classes>(t); }, "rename");
  ops_of([](const X& t) { return mt::replace_dimensions<list<batch, hidden>, list<hidden, batch>>(t); }, "replace_dimensions");
  ops_of([](const X& t) { return mt::reshape<classes>(t, {24}); }, "reshape");
  ops_of([](const X& t) { return mt::replace_dimensions<list<batch>, list<classes, d_model>>(t, {2, 3}); }, "replace_dimensions");
  // sum_to, public beside reduce_sum, allreduces the split batch under its own name too.
  ops_of([](const X& t) { return mt::sum_to<mt::tensor<float, L, hidden>>(t); }, "sum_to");
}
