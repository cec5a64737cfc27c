// einsum_scattered sums each part's addends around the ring of the axes it scatters over: they
// must be the axes of the dims the product contracts (here j is split over y, the result over x).
// expect: einsum_scattered: S must split the scattered dim over exactly the axes of the dims the product contracts
// expect-first: einsum_scattered
// expect: einsum_scattered_axes_not_the_sums
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct i : mt::dim<"i"> {};
struct j : mt::dim<"j"> {};
struct k : mt::dim<"k"> {};
struct x : mt::axis<"x"> {};
struct y : mt::axis<"y"> {};
using M = mt::mesh<x, y>;
using L = mt::layout<M, mt::split<j, y>>;
using LS = mt::layout<M, mt::split<j, y>, mt::split<i, x>>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const M m(MPI_COMM_WORLD, {1, 1});
  const auto a = mt::zeros<mt::tensor<float, L, i, j>>(m, {4, 2});
  const auto w = mt::zeros<mt::tensor<float, L, j, k>>(m, {2, 3});
  (void)mt::einsum_scattered<mt::tensor<float, LS, i, k>>(a, w);
}
