// item() reads a rank-0 tensor only.
// expect: reads a rank-0 tensor; gather_all or gather read the others
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>>;
int main() {
  mt::tensor<float, L, batch> t;
  return static_cast<int>(mt::item(t));
}
