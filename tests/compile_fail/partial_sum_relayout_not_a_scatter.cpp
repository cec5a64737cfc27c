// A relayout of a partial sum over x to a layout that splits nothing over x: no reduce_scatter
// can deliver it, and the allreduce it needs must be written (sum_partials).
// expect: relayout of a partial sum: the target layout must split dims over exactly the partial sum's axes
// expect-first: relayout of a partial sum
// expect: relayout_of_partial_sum_not_a_scatter
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct i : mt::dim<"i"> {};
struct j : mt::dim<"j"> {};
struct x : mt::axis<"x"> {};
using L = mt::layout<mt::mesh<x>, mt::split<j, x>>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto a = mt::zeros<mt::tensor<float, L, i, j>>(m, {2, 4});
  const auto b = mt::zeros<mt::tensor<float, L, j>>(m, {4});
  (void)mt::relayout<mt::tensor<float, mt::layout<mt::mesh<x>>, i>>(mt::einsum_partial<i>(a, b));
}
