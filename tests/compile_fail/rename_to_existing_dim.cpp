// rename's new dim is already a dim of the tensor (the result would name it twice).
// expect: rename's new dim is already a dim of the tensor
// expect: rename_target_already_in_tensor<hidden>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  auto b = mt::rename<batch, hidden>(a);
}
