// A stencil along a dim the tensor does not have: refused by name, listing the dims that are missing,
// before the op's body reports anything.
// expect: stencil<Ds...> names dims that the tensor X does not have
// expect: stencil_dim_not_in_tensor<meshtensor::basic_tensor<double, [^<>]*<meshtensor::mesh<rows> >, [^<>]*, x, y>, meshtensor::type_list<z> >
// expect-first: meshtensor: stencil<Ds...> names dims that the tensor X does not have
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct x : mt::dim<"x"> {};
struct y : mt::dim<"y"> {};
struct z : mt::dim<"z"> {};
struct rows : mt::axis<"rows"> {};
using field = mt::tensor<double, mt::layout<mt::mesh<rows>>, x, y>;
int main() {
  field u;
  (void)mt::stencil<x, z>(u, 1, mt::boundary::zero_fill, [](const mt::stencil_neighbours<double, 2>& at) { return at(1, 0); });
}
