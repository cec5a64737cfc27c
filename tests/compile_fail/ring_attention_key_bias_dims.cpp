// ring_causal_attention with a key bias over the queries' positions (Length) rather than the keys'
// (MemLength): a key bias is per key.
// expect: ring_causal_attention's key_bias is per key of each sequence: its dims must be x's other than Length and DModel, in x's order, then MemLength
// expect: ring_attention_key_bias_dims<
#include <meshtensor/nn/ring_attention.hpp>
namespace mt = meshtensor;
struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct mlen : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct context : mt::axis<"context"> {};
using L = mt::layout<mt::mesh<context>, mt::split<length, context>>;
int main() {
  mt::tensor<float, L, batch, length, d_model> x;
  mt::tensor<float, L, d_model, heads, d_kv> w;
  mt::tensor<float, L, heads, d_kv, d_model> wo;
  mt::tensor<float, L, batch, length> bias;
  (void)mt::nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(x, w, w, w, wo, bias);
}
