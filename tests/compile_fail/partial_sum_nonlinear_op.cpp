// A nonlinear op on a partial sum: exp of a sum is not the sum of exps, and forcing the allreduce
// inside the expression would hide it. The program must call sum_partials (or relayout) first.
// expect: no matching function for call to [^ ]*exp\(
// expect-first: no matching function for call to [^ ]*exp\(
// expect: partial_sum<
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
  (void)mt::exp(mt::einsum_partial<i>(a, b));
}
