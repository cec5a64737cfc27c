// ring_causal_attention on a sequence whose length is not split: there is no ring to pass blocks around.
// expect: ring_causal_attention passes blocks of a split sequence around a ring; x's layout does not split Length
// expect: ring_attention_needs_a_split_length<length>
#include <meshtensor/nn/ring_attention.hpp>
namespace mt = meshtensor;
struct length : mt::dim<"length"> {};
struct mlen : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct context : mt::axis<"context"> {};
using L = mt::layout<mt::mesh<context>, mt::split<heads, context>>;
int main() {
  mt::tensor<float, L, length, d_model> x;
  mt::tensor<float, L, d_model, heads, d_kv> w;
  mt::tensor<float, L, heads, d_kv, d_model> wo;
  (void)mt::nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(x, w, w, w, wo);
}
