// Mesh-TensorFlow's rules d_ff:model and heads:model are fine alone, but a tensor holding both dims
// would split two dims over one axis.
// expect: a tensor would split two of its dims over one mesh axis
// expect: axis_used_twice<heads, d_ff, model>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct heads : mt::dim<"heads"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct model : mt::axis<"model"> {};
using grid = mt::mesh<model>;
using rules = mt::layout<grid, mt::split<d_ff, model>, mt::split<heads, model>>;
using fine_alone = mt::tensor<float, rules, d_ff>;
using bad = mt::tensor<float, rules, heads, d_ff>;
int main() { bad t; }
