// The tensors of one fused expression must share element type, layout and space, as a binary op's.
// Here the element type differs, on which fuse's body would raise errors of its own: the sentence
// must be the first error (fuse stops there).
// expect: operands_differ_in_layout
// expect: convert one with cast<> or relayout<> first
// expect-first: meshtensor: the operands of an op must share
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct i : mt::dim<"i"> {};
struct x : mt::axis<"x"> {};
using M = mt::mesh<x>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const M m(MPI_COMM_WORLD, {1});
  const auto a = mt::zeros<mt::tensor<float, mt::layout<M>, i>>(m, {4});
  const auto b = mt::zeros<mt::tensor<double, mt::layout<M>, i>>(m, {4});
  (void)mt::fuse([](auto p, auto q) { return p + q; }, a, b);
}
