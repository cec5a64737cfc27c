// ring_grouped_causal_attention with the group (query heads) split over an axis that also splits
// the sequence: refused as the multi-head ring refuses its heads there, naming the dim.
// expect: ring_causal_attention: a context axis also used for heads under the ring
// expect: ring_attention_heads_on_a_context_axis<group>
// expect-first: ring_causal_attention: a context axis also used for heads under the ring
#include <meshtensor/nn/ring_attention.hpp>
namespace mt = meshtensor;
struct length : mt::dim<"length"> {};
struct mlen : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct kv_heads : mt::dim<"kv_heads"> {};
struct group : mt::dim<"group"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct context : mt::axis<"context"> {};
struct model : mt::axis<"model"> {};
using L = mt::layout<mt::mesh<context, model>, mt::split<length, context>, mt::split<kv_heads, model>,
                     mt::split<group, context>>;
int main() {
  mt::tensor<float, L, length, d_model> x;
  mt::tensor<float, L, d_model, kv_heads, group, d_kv> wq;
  mt::tensor<float, L, d_model, kv_heads, d_kv> wk;
  mt::tensor<float, L, kv_heads, group, d_kv, d_model> wo;
  (void)mt::nn::ring_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x, wq, wk, wk, wo);
}
