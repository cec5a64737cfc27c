// relu of complex values: "x > 0" has no meaning for them; the elementwise table names the op.
// expect: relu takes real values, not complex ones
// expect-first: relu takes real values
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct d : mt::dim<"d"> {};
struct x : mt::axis<"x"> {};
using field = mt::tensor<mt::complex<float>, mt::layout<mt::mesh<x>>, d>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto z = mt::zeros<field>(m, {4});
  (void)mt::relu(z);
}
