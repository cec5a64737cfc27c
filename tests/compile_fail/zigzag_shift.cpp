// shift along a dim that the layout cuts zigzag: the neighbours of a processor's two ranges are not
// its ring neighbours' edges.
// expect: this op works along a dim that the tensor's layout cuts zigzag
// expect: op_along_zigzag_dim<.*shift.*, *seq>
// expect-first: this op works along a dim that the tensor's layout cuts zigzag
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct seq : mt::dim<"seq"> {};
struct d : mt::dim<"d"> {};
struct ctx : mt::axis<"ctx"> {};
using L = mt::layout<mt::mesh<ctx>, mt::zigzag<seq, ctx>>;
int main() {
  mt::tensor<float, L, seq, d> x;
  (void)mt::shift<seq>(x, 1);
}
