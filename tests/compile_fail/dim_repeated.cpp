// A tensor type names one dim twice.
// expect: a tensor type names one dim twice
// expect: dim_repeated<batch>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct rows : mt::axis<"rows"> {};
using bad = mt::tensor<float, mt::layout<mt::mesh<rows>>, batch, batch>;
int main() { bad t; }
