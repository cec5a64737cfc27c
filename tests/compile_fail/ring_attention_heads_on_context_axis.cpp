// ring_causal_attention with the heads split over an axis that also splits the sequence: q would hold
// both dims split over one axis, and the ring passes whole heads' blocks along the sequence's axes.
// expect: ring_causal_attention: a context axis also used for heads under the ring
// expect: ring_attention_heads_on_a_context_axis<heads>
// expect-first: ring_causal_attention: a context axis also used for heads under the ring
#include <meshtensor/nn/ring_attention.hpp>
namespace mt = meshtensor;
struct length : mt::dim<"length"> {};
struct mlen : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct context : mt::axis<"context"> {};
using L = mt::layout<mt::mesh<context>, mt::split<length, context>, mt::split<heads, context>>;
int main() {
  mt::tensor<float, L, length, d_model> x;
  mt::tensor<float, L, d_model, heads, d_kv> w;
  mt::tensor<float, L, heads, d_kv, d_model> wo;
  (void)mt::nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(x, w, w, w, wo);
}
