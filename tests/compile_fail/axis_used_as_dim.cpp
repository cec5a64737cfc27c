// A mesh axis (declared with axis<>) used as a dim of a tensor type.
// expect: a mesh axis \(declared with axis<>\) is used as a tensor dim
// expect: axis_used_as_dim<cols>
// expect-first: meshtensor: a mesh axis
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() { mt::tensor<float, L, batch, cols> t; }
