// A layout rule names an axis that the mesh lacks.
// expect: a layout rule splits a dim over an axis that the mesh does not have
// expect: axis_not_in_mesh<batch, cols, meshtensor::mesh<rows> >
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using bad = mt::layout<mt::mesh<rows>, mt::split<batch, cols>>;
int main() { mt::tensor<float, bad, batch> t; }
