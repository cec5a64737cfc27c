// concat of two tensors with the same dims in different orders.
// expect: concat's operands have the same dims in different orders
// expect: concat_dims_in_different_orders<meshtensor::type_list<batch, hidden>, meshtensor::type_list<hidden, batch> >
// expect-first: meshtensor: concat's operands
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  mt::tensor<float, L, hidden, batch> b;
  auto c = mt::concat<batch>(a, b);
}
