// reshape given fewer extents than new dims (a std::array parameter would make the missing one 0).
// expect: reshape needs exactly one extent per new dim
// expect: reshape_extent_count_differs<meshtensor::type_list<batch, hidden>, meshtensor::diagnostic::extents_expected<2>, meshtensor::diagnostic::extents_given<1> >
// expect-first: meshtensor: reshape needs exactly one extent per new dim
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  auto b = mt::reshape<batch, hidden>(a, {8});
}
