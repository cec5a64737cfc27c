// zigzag<Dim, Axes...> naming one axis twice.
// expect: a layout rule names one axis twice
// expect: axis_repeated_in_rule<seq, ctx>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct seq : mt::dim<"seq"> {};
struct ctx : mt::axis<"ctx"> {};
using bad = mt::layout<mt::mesh<ctx>, mt::zigzag<seq, ctx, ctx>>;
int main() { mt::tensor<float, bad, seq> t; }
