// unfold over a spatial dim the image does not have.
// expect: unfold/fold: a spatial dim is not a dim of the input
// expect-first: a spatial dim is not a dim of the input
// expect: unfold_spatial_dim_not_in_input<depth>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct h : mt::dim<"h"> {};
struct w : mt::dim<"w"> {};
struct depth : mt::dim<"depth"> {};
struct kd : mt::dim<"kd"> {};
struct rows : mt::axis<"rows"> {};
using image = mt::tensor<float, mt::layout<mt::mesh<rows>, mt::split<h, rows>>, batch, h, w>;
int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const mt::mesh<rows> m(MPI_COMM_WORLD, {1});
  const auto x = mt::zeros<image>(m, {1, 8, 8});
  (void)mt::unfold<mt::spatial<depth, kd>>(x, mt::window{.size = 3});
}
