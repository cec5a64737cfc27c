// reshape's result names one dim twice.
// expect: reshape's result names one dim twice
// expect: reshape_dim_repeated<hidden>
#include <meshtensor/meshtensor.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct rows : mt::axis<"rows"> {};
using L = mt::layout<mt::mesh<rows>, mt::split<batch, rows>>;
int main() {
  mt::tensor<float, L, batch, hidden> a;
  auto b = mt::reshape<batch, hidden, hidden>(a, {4, 2, 2});
}
