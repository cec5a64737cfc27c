// A plain struct, not derived from dim<"name">, used as a dim of a tensor type.
// expect: a tensor dim must derive from dim<"name">
// expect: not_a_dim<hidden>
// expect-first: meshtensor: a tensor dim must derive
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() { mt::tensor<float, L, batch, hidden> t; }
