// The function given to fuse returns a tensor it captured instead of an expression of its
// arguments: nothing would be fused (and the captured tensor's op would run outside the kernel).
// expect: meshtensor::fuse: f must return an expression of its arguments
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct i : mt::dim<"i"> {};
struct x : mt::axis<"x"> {};
using L = mt::layout<mt::mesh<x>>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  const auto a = mt::zeros<mt::tensor<float, L, i>>(m, {4});
  (void)mt::fuse([&](auto) { return mt::exp(a); }, a);
}
