// rope over a layout that splits the rotated dim: features i and i + d/2 are rotated together, so
// each processor must hold the whole dim. The sentence is the first error, and names the dim.
// expect: rope: the layout splits the rotated \(Feature\) dim
// expect: rope_feature_dim_is_split<d_kv>
// expect-first: meshtensor::nn::rope: the layout splits the rotated
#include <meshtensor/nn/rope.hpp>
namespace mt = meshtensor;
struct length : mt::dim<"length"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct model : mt::axis<"model"> {};
using L = mt::layout<mt::mesh<model>, mt::split<d_kv, model>>;
int main() {
  mt::tensor<float, L, length, d_kv> q;
  (void)mt::nn::rope<length, d_kv>(q);
}
