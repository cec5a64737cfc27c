// fuse of complex tensors takes the holomorphic ops, as the unfused ops do; one that takes real
// values only (relu: an order) refuses complex ones by name, here as unfused, rather than
// differentiate them wrongly.
// expect: relu takes real values, not complex ones
// expect-first: relu takes real values
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct d : mt::dim<"d"> {};
struct x : mt::axis<"x"> {};
using field = mt::tensor<mt::complex<double>, mt::layout<mt::mesh<x>>, d>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto z = mt::zeros<field>(m, {4});
  (void)mt::fuse([](auto v) { return mt::exp(v) * mt::relu(v); }, z);
}
