// einsum's output names a dim that no input has.
// expect: einsum's output names a dim that no input has
// expect: einsum_output_dim_not_in_inputs<vocab>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct vocab : mt::dim<"vocab"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  mt::tensor<float, L, hidden> b;
  auto c = mt::einsum<batch, vocab>(a, b);
}
