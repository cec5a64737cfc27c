// ring_causal_attention with a key bias split along MemLength: each block's bias is read at its keys'
// global positions, so every processor must hold the whole bias along MemLength.
// expect: every processor holds the whole key_bias along MemLength: its layout must not split MemLength
// expect: ring_attention_key_bias_split<mlen>
#include <meshtensor/nn/ring_attention.hpp>
namespace mt = meshtensor;
struct length : mt::dim<"length"> {};
struct mlen : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct context : mt::axis<"context"> {};
using L = mt::layout<mt::mesh<context>, mt::split<length, context>>;
using LB = mt::layout<mt::mesh<context>, mt::split<mlen, context>>;
int main() {
  mt::tensor<float, L, length, d_model> x;
  mt::tensor<float, L, d_model, heads, d_kv> w;
  mt::tensor<float, L, heads, d_kv, d_model> wo;
  mt::tensor<float, LB, mlen> bias;
  (void)mt::nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(x, w, w, w, wo, bias);
}
