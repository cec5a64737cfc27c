// softmax of complex values: complex numbers have no order, so no max to shift by and no
// distribution over them.
// expect: softmax takes real values: complex ones have no order
// expect-first: softmax takes real values
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct d : mt::dim<"d"> {};
struct x : mt::axis<"x"> {};
using field = mt::tensor<mt::complex<double>, mt::layout<mt::mesh<x>>, d>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto z = mt::zeros<field>(m, {4});
  (void)mt::softmax<d>(z);
}
