// einsum of operands under different layouts: the sentence must be the first error, before any
// from the op's gradient rule.
// expect: the operands of an op must share element type, layout and execution space
// expect: operands_differ_in_layout<meshtensor::basic_tensor<float, meshtensor::layout<meshtensor::mesh<rows>, meshtensor::split<batch, rows> >, [^<>]*, batch, hidden>, meshtensor::basic_tensor<float, meshtensor::layout<meshtensor::mesh<rows> >, [^<>]*, hidden> >
// expect-first: meshtensor: the operands of an op must share
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
using replicated = mt::layout<mt::mesh<rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  mt::tensor<float, replicated, hidden> b;
  auto c = mt::einsum<batch>(a, b);
}
