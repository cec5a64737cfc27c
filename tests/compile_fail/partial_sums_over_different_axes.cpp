// Partial sums over different axes added: their addends are not parts of one sum.
// expect: partial sums over different mesh axes cannot be added locally
// expect-first: partial sums over different mesh axes
// expect: partial_sums_over_different_axes
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct i : mt::dim<"i"> {};
struct j : mt::dim<"j"> {};
struct k : mt::dim<"k"> {};
struct r : mt::axis<"r"> {};
struct c : mt::axis<"c"> {};
using L = mt::layout<mt::mesh<r, c>, mt::split<j, r>, mt::split<k, c>>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<r, c> m(MPI_COMM_WORLD, {1, 1});
  const auto a = mt::zeros<mt::tensor<float, L, i, j>>(m, {2, 4});
  const auto b = mt::zeros<mt::tensor<float, L, j>>(m, {4});
  const auto d = mt::zeros<mt::tensor<float, L, i, k>>(m, {2, 3});
  const auto e = mt::zeros<mt::tensor<float, L, k>>(m, {3});
  (void)(mt::einsum_partial<i>(a, b) + mt::einsum_partial<i>(d, e));
}
