// A planned run (mesh::planned, docs/plan-mode.md) predicts what a real run does, exactly: on every
// rank, a training step (a Transformer block and an MLP, forward, backward, Adam and Adafactor) is
// run for real, then planned in the same process for this rank's coordinates of a mesh of the same
// sizes; the counted collectives (calls and bytes, per collective and axis set) and the bytes of
// the parameters and optimizer state must be equal, under 5 layouts of the Transformer and 6 of the MLP.
// (A TU of mpi_planned_run_test: see planned_run.hpp.)
#include <catch2/matchers/catch_matchers_string.hpp>

#include "planned_run.hpp"

using namespace tst;
using namespace tst::planned_run;

// The 2-D layouts of the Transformer are in planned_run_test.mlp.cpp.
using transformer_layouts =
    list<mt::layout<grid>, mt::layout<grid, mt::split<batch, r_, c_>>,
         mt::layout<grid, mt::split<vocab, r_, c_>, mt::split<heads, r_, c_>, mt::split<d_ff, r_, c_>>>;

TEST_CASE("a planned Transformer step counts what the real one sends", "[planned]") {
  const auto g = world_grid();
  for_each_type(transformer_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    check_planned_equals_real(g, [](const grid& m) { return transformer_step<L>(m); });
  });
}

TEST_CASE("the host waits for the device before MPI reads a slice and before it reads one itself", "[planned]") {
  // d_model contracted and split over c: the product's partial sums are allreduced in place, so MPI
  // reads the slice once the kernels that wrote it are done (one wait, whether or not c has more
  // than one processor: the group of one is skipped after its buffer is made). item() reads the
  // loss on the host (one more). A plan counts the same two and waits for nothing.
  using L = mt::layout<grid, mt::split<d_model, c_>>;
  const auto step = [](const grid& m) {
    const auto x = mt::random_normal<mt::tensor<float, L, batch, d_model>>(m, {B, D}, 1);
    const auto w = mt::random_normal<mt::tensor<float, L, d_model, hidden>>(m, {D, HID}, 2);
    const std::int64_t before = mt::host_waits();
    const auto y = mt::einsum<batch, hidden>(x, w);
    const std::int64_t after_product = mt::host_waits() - before;
    (void)mt::item(mt::reduce_sum<batch, hidden>(y));
    return std::pair{after_product, mt::host_waits() - before};
  };
  const auto g = world_grid();
  const auto real = step(g);
  CHECK(real.first == 1);
  CHECK(real.second == 2);
  const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
  mt::reset_plan(pm);
  const auto planned = step(pm);
  CHECK(planned.second == 0);
  CHECK(mt::plan_report_of(pm).waits == 2);
}
