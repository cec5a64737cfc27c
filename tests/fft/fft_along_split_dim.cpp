// fft along a dim that the layout splits: each processor transforms the lines it holds whole, so
// the dim must be relayouted whole first. The first error says so and names the dim.
// expect: fft<D> along a dim that the layout splits
// expect: fft_dim_is_split<x_d>
// expect-first: fft<D> along a dim that the layout splits
#include <meshtensor/fft/fft.hpp>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct x_d : mt::dim<"x"> {};
struct p : mt::axis<"p"> {};
using field = mt::tensor<mt::complex<double>, mt::layout<mt::mesh<p>, mt::split<x_d, p>>, x_d>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<p> m(MPI_COMM_WORLD, {1});
  const auto z = mt::zeros<field>(m, {8});
  (void)mt::fft<x_d>(z);
}
