// One rule names one axis twice.
// expect: a layout rule names one axis twice
// expect: axis_repeated_in_rule<batch, rows>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct rows : mt::axis<"rows"> {};
using bad = mt::layout<mt::mesh<rows>, mt::split<batch, rows, rows>>;
int main() { mt::tensor<float, bad, batch> t; }
