// zigzag<Dim, Axes...> over an axis the mesh does not have: the rule's checks are split's.
// expect: a layout rule splits a dim over an axis that the mesh does not have
// expect: axis_not_in_mesh<seq, cols, meshtensor::mesh<rows> >
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct seq : mt::dim<"seq"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using bad = mt::layout<mt::mesh<rows>, mt::zigzag<seq, cols>>;
int main() { mt::tensor<float, bad, seq> t; }
