#pragma once
// The blocks of an encoder-decoder Transformer (Vaswani et al.; the paper's Table 3 model), with
// layer norms before each sublayer (pre-LN: the form that trains without a learning-rate warm-up
// at these sizes, and PyTorch's nn.Transformer(norm_first=True)):
// (each residual add and its dropout one fused kernel: nn::residual_dropout)
//   encoder_block:  a = x + dropout(self_attention(ln(x), key_bias))
//                   y = a + dropout(feed_forward(ln(a)))
//   decoder_block:  a = y + dropout(causal_attention(ln(y)))
//                   c = a + dropout(attention(ln(a), memory, memory_bias))      (cross-attention)
//                   out = c + dropout(feed_forward(ln(c)))
// memory is the encoder's output with its positions' dim renamed MemLength (rename once, share it
// across the decoder's blocks); key_bias / memory_bias mask padded source positions (padding_bias).
// The weights come as references grouped per sublayer (attention_sublayer, feed_forward_sublayer):
// a model keeps its own tensors (one vector per kind, as the optimizers take them) and names them
// here. Every layout of the layers they are made of works here: batch split (data parallelism),
// heads and d_ff split (the paper's model parallelism), both on a 2-D mesh; the collectives are
// those layers' (attention's and the feed-forward's output products allreduce over the heads' and
// d_ff's axes; layer norms none unless d_model is split).
#include <cstdint>

#include "attention.hpp"
#include "dropout.hpp"
#include "feed_forward.hpp"
#include "layer_norm.hpp"

namespace meshtensor::nn {

// An attention sublayer's weights: its layer norm's scale and bias, and the four projections.
template <Tensor S, Tensor W, Tensor WO>
struct attention_sublayer {
  const S& ln_scale;
  const S& ln_bias;
  const W& wq;
  const W& wk;
  const W& wv;
  const WO& wo;
};
template <Tensor S, Tensor W, Tensor WO>
attention_sublayer(const S&, const S&, const W&, const W&, const W&, const WO&) -> attention_sublayer<S, W, WO>;

// A feed-forward sublayer's weights: its layer norm's scale and bias, and the two products'.
template <Tensor S, Tensor WI, Tensor WF>
struct feed_forward_sublayer {
  const S& ln_scale;
  const S& ln_bias;
  const WI& w_in;
  const WF& w_out;
};
template <Tensor S, Tensor WI, Tensor WF>
feed_forward_sublayer(const S&, const S&, const WI&, const WF&) -> feed_forward_sublayer<S, WI, WF>;

// Dropout of a block's sublayers: sublayer i of the block draws its mask from (seed + i, step), so
// the masks are the same under every layout (nn/dropout.hpp) and differ between blocks given
// different seeds. rate 0: none.
struct block_dropout {
  double rate = 0;
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
};

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Dim DFf, Tensor X, Tensor Bias, Tensor S,
          Tensor W, Tensor WO, Tensor WI, Tensor WF>
X encoder_block(const X& x, const Bias& key_bias, const attention_sublayer<S, W, WO>& self,
                const feed_forward_sublayer<S, WI, WF>& ff, block_dropout drop = {}) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"encoder_block"});
  const auto h = layer_norm<DModel>(x, self.ln_scale, self.ln_bias);
  const X a = residual_dropout(
      x, self_attention<Length, MemLength, DModel, Heads, DKv>(h, self.wq, self.wk, self.wv, self.wo, key_bias), drop.rate,
      drop.seed, drop.step);
  const auto f = layer_norm<DModel>(a, ff.ln_scale, ff.ln_bias);
  return residual_dropout(a, feed_forward<DModel, DFf>(f, ff.w_in, ff.w_out), drop.rate, drop.seed + 1, drop.step);
}

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Dim DFf, Tensor Y, Tensor M, Tensor Bias,
          Tensor S, Tensor W, Tensor WO, Tensor WI, Tensor WF>
Y decoder_block(const Y& y, const M& memory, const Bias& memory_bias, const attention_sublayer<S, W, WO>& self,
                const attention_sublayer<S, W, WO>& cross, const feed_forward_sublayer<S, WI, WF>& ff,
                block_dropout drop = {}) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"decoder_block"});
  const auto h = layer_norm<DModel>(y, self.ln_scale, self.ln_bias);
  const Y a = residual_dropout(
      y, causal_attention<Length, MemLength, DModel, Heads, DKv>(h, self.wq, self.wk, self.wv, self.wo), drop.rate,
      drop.seed, drop.step);
  const auto hc = layer_norm<DModel>(a, cross.ln_scale, cross.ln_bias);
  const Y c = residual_dropout(a,
                               attention<Length, MemLength, DModel, Heads, DKv>(hc, memory, cross.wq, cross.wk, cross.wv,
                                                                               cross.wo, memory_bias),
                               drop.rate, drop.seed + 1, drop.step);
  const auto f = layer_norm<DModel>(c, ff.ln_scale, ff.ln_bias);
  return residual_dropout(c, feed_forward<DModel, DFf>(f, ff.w_in, ff.w_out), drop.rate, drop.seed + 2, drop.step);
}

}  // namespace meshtensor::nn
