// A stencil's field under another layout than its input: the field is read at the point being
// computed, so it must be held as the input is; refused by name, naming both types.
// expect: a stencil's fields are read at the point being computed and must have the tensor's dims in its order and its layout, in its memory space
// expect: stencil_field_differs_in_dims_or_layout<meshtensor::basic_tensor<double, meshtensor::layout<meshtensor::mesh<rows>, meshtensor::split<x, rows> >, [^<>]*, x, y>, meshtensor::basic_tensor<double, meshtensor::layout<meshtensor::mesh<rows> >, [^<>]*, x, y> >
// expect-first: meshtensor: a stencil's fields are read at the point
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct x : mt::dim<"x"> {};
struct y : mt::dim<"y"> {};
struct rows : mt::axis<"rows"> {};
using split_x = mt::layout<mt::mesh<rows>, mt::split<x, rows>>;
using replicated = mt::layout<mt::mesh<rows>>;
int main() {
  mt::tensor<double, split_x, x, y> u;
  mt::tensor<double, replicated, x, y> f;
  (void)mt::stencil<x>(u, 1, mt::boundary::zero_fill, [](const mt::stencil_neighbours<double, 1>& at, double c) { return at(1) * c; }, f);
}
