// cumsum along a dim that the layout cuts zigzag: a processor holds two ranges of it, and the
// running sum needs each part to be one range.
// expect: this op works along a dim that the tensor's layout cuts zigzag
// expect: op_along_zigzag_dim<.*cumsum.*, *seq>
// expect-first: this op works along a dim that the tensor's layout cuts zigzag
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct seq : mt::dim<"seq"> {};
struct ctx : mt::axis<"ctx"> {};
using L = mt::layout<mt::mesh<ctx>, mt::zigzag<seq, ctx>>;
int main() {
  mt::tensor<float, L, seq> x;
  (void)mt::cumsum<seq>(x);
}
