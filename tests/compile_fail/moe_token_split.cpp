// nn::moe under a layout that splits the token dim: routing needs each group's tokens whole.
// expect: the layout splits a dim that moe needs whole
// expect: moe_dim_must_not_be_split<token, meshtensor::layout<
#include <meshtensor/nn/moe.hpp>
namespace mt = meshtensor;
namespace nn = meshtensor::nn;
struct group : mt::dim<"group"> {};
struct token : mt::dim<"token"> {};
struct d_model : mt::dim<"d_model"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct experts : mt::dim<"experts"> {};
struct rows : mt::axis<"rows"> {};
using dims = nn::moe_dims<group, token, d_model, d_ff, experts>;
using bad = mt::layout<mt::mesh<rows>, mt::split<token, rows>>;
int main() {
  using X = mt::tensor<float, bad, group, token, d_model>;
  X x;
  mt::tensor<float, bad, d_model, dims::experts_unsplit> wg;
  mt::tensor<float, bad, experts, d_model, d_ff> wi;
  mt::tensor<float, bad, experts, d_ff, d_model> wo;
  (void)nn::moe<dims>(x, wg, wi, wo, 4);
}
