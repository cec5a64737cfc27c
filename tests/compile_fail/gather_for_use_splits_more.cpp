// gather_for_use to a layout that splits a dim the stored layout leaves whole: that is a
// relayout (a split moving between dims), not a gather before use, and must be written so.
// expect: Use must keep p's dims, element type, space and mesh, and split each dim over a prefix
// expect-first: gather_for_use
// expect: gather_for_use_must_only_gather
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct j : mt::dim<"j"> {};
struct k : mt::dim<"k"> {};
struct x : mt::axis<"x"> {};
using stored = mt::tensor<float, mt::layout<mt::mesh<x>, mt::split<j, x>>, j, k>;
using used = mt::tensor<float, mt::layout<mt::mesh<x>, mt::split<k, x>>, j, k>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto w = mt::zeros<stored>(m, {4, 4});
  (void)mt::gather_for_use<used>(w);
}
