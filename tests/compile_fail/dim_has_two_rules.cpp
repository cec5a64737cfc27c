// One dim, two layout rules.
// expect: a layout has two rules for one dim
// expect: dim_has_two_rules<batch>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using bad = mt::layout<mt::mesh<rows, cols>, mt::split<batch, rows>, mt::split<batch, cols>>;
int main() { mt::tensor<float, bad, batch> t; }
