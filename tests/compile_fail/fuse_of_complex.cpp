// fuse of complex tensors: its backward kernel multiplies by the plain derivative, where complex
// values need its conjugate (element/complex.hpp), so it refuses them rather than differentiate
// them wrongly.
// expect: fuse takes real tensors, not complex ones
// expect-first: fuse takes real tensors
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct d : mt::dim<"d"> {};
struct x : mt::axis<"x"> {};
using field = mt::tensor<mt::complex<double>, mt::layout<mt::mesh<x>>, d>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto z = mt::zeros<field>(m, {4});
  (void)mt::fuse([](auto v) { return mt::exp(v) * v; }, z);
}
