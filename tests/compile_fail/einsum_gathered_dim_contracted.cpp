// einsum_gathered gathers x's split sequence part by part, each part giving the result's rows of
// that part: a product that contracts the gathered dim has no such rows.
// expect: einsum_gathered: the gathered dim D must be a dim of the result and not of w
// expect-first: einsum_gathered
// expect: einsum_gathered_dim_not_in_result_alone
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct i : mt::dim<"i"> {};
struct j : mt::dim<"j"> {};
struct x : mt::axis<"x"> {};
using L = mt::layout<mt::mesh<x>, mt::split<j, x>>;
using LS = mt::layout<mt::mesh<x>, mt::split<j, x>, mt::split<i, x>>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto xs = mt::zeros<mt::tensor<float, LS, i>>(m, {4});
  const auto w = mt::zeros<mt::tensor<float, L, i, j>>(m, {4, 2});
  (void)mt::einsum_gathered<mt::tensor<float, L, i>, j>(xs, w);
}
