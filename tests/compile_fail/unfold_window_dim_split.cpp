// A layout that splits a window dim: the taps of one window must stay on one processor.
// expect: unfold/fold: a window dim is split by the layout
// expect-first: a window dim is split by the layout
// expect: unfold_window_dim_split<kh>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct h : mt::dim<"h"> {};
struct kh : mt::dim<"kh"> {};
struct rows : mt::axis<"rows"> {};
using image = mt::tensor<float, mt::layout<mt::mesh<rows>, mt::split<kh, rows>>, batch, h>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<rows> m(MPI_COMM_WORLD, {1});
  const auto x = mt::zeros<image>(m, {1, 8});
  (void)mt::unfold<mt::spatial<h, kh>>(x, mt::window{.size = 3});
}
