// A bf16 parameter handed to an optimizer: its small updates would round away.
// expect: optimizers update float \(or double\) master weights, not bf16 parameters
// expect-first: optimizers update float \(or double\) master weights
// expect: cast<bf16>\(parameter\)
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct d : mt::dim<"d"> {};
struct x : mt::axis<"x"> {};
using weights = mt::tensor<mt::bf16, mt::layout<mt::mesh<x>>, d>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<x> m(MPI_COMM_WORLD, {1});
  auto w = mt::zeros<weights>(m, {4});
  auto g = w;
  mt::optim::sgd opt({.lr = 0.1});
  opt.step(std::tie(w), std::tuple<weights>(g));
}
