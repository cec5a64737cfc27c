// rename names a dim the tensor does not have.
// expect: rename names a dim to replace that the tensor does not have
// expect: rename_source_not_in_tensor<vocab>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct vocab : mt::dim<"vocab"> {};
struct logits : mt::dim<"logits"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  auto b = mt::rename<vocab, logits>(a);
}
