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
