#pragma once
// chunked_cross_entropy<Model, Vocab, Along>(h, w, labels, chunks): the mean over every position of
// softmax_cross_entropy<Vocab>(dense<Model, Vocab>(h, w), labels), with the logits computed for
// 1/chunks of each processor's positions along Along at a time (ops/local_chunk.hpp), forward and
// backward: the whole [..., Vocab] logits, and their float copy, softmax and gradient, never exist.
// A large vocabulary's logits are the largest activation of a language model: Llama 3's 128,256
// entries per token in float are 31 times a block's d_model of 4,096, and at a million tokens they
// do not fit anywhere (docs/scale.md). Each piece's logits are made again in the backward pass
// (mt::recompute): the output layer's product runs twice, as under full recomputation.
// chunks = 1 is the plain composition, nothing recomputed. The loss in float (bf16 logits cast up
// first), double where h is double. w may be of another element type than h (a float master weight
// under bf16 activations): each piece casts it to h's, so that the pieces' gradients add up in w's
// type, not rounded to bf16 once per piece. Communication: the product's and the loss's, once per
// piece (the same bytes in `chunks` calls), and again in the backward pass; local_chunk moves nothing.
// Along must be cut into equal parts of a multiple of `chunks` (local_chunk's refusal names it).
#include <cstdint>
#include <optional>
#include <type_traits>

#include "../autodiff/recompute.hpp"
#include "../ops/cast.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/local_chunk.hpp"
#include "../ops/sum_broadcast.hpp"
#include "cross_entropy.hpp"
#include "dense.hpp"

namespace meshtensor::nn {

template <Dim Model, Dim Vocab, Dim Along, Tensor H, Tensor W, Tensor Labels>
auto chunked_cross_entropy(const H& h, const W& w, const Labels& labels, std::int64_t chunks) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"chunked_cross_entropy"});
  static_assert(contains_v<Along, typename H::dims> && contains_v<Along, typename Labels::dims>,
                "meshtensor::nn::chunked_cross_entropy<Model, Vocab, Along>: h and the labels must both hold Along");
  using T = typename H::value_type;
  using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
  // Each position's loss; w cast to h's element type here, inside the piece (see above).
  const auto losses = [](const auto& x, const auto& w, const auto& ids) {
    const auto logits = [&] {
      if constexpr (std::is_same_v<typename W::value_type, T>) return dense<Model, Vocab>(x, w);
      else return dense<Model, Vocab>(x, cast<T>(w));
    }();
    if constexpr (std::is_same_v<T, F>) return softmax_cross_entropy<Vocab>(logits, ids);
    else return softmax_cross_entropy<Vocab>(cast<F>(logits), ids);
  };
  const auto sum_all = [](const auto& loss) {
    return [&]<class... Ds>(type_list<Ds...>) { return reduce_sum<Ds...>(loss); }(typename std::remove_cvref_t<decltype(loss)>::dims{});
  };
  const auto mean_all = [](const auto& loss) {
    return [&]<class... Ds>(type_list<Ds...>) { return reduce_mean<Ds...>(loss); }(typename std::remove_cvref_t<decltype(loss)>::dims{});
  };
  if (chunks < 1)
    throw shape_error(meshtensor::detail::cat("chunked_cross_entropy: ", chunks, " chunks along dim '", Along::name(),
                                              "'; at least 1"));
  using Sum = decltype(sum_all(losses(h, w, labels)));
  if (chunks == 1) return Sum(mean_all(losses(h, w, labels)));  // the plain loss, reduce_mean's arithmetic
  std::int64_t positions = 1;
  for (const std::int64_t e : labels.extents()) positions *= e;
  std::optional<Sum> total;
  for (std::int64_t c = 0; c < chunks; ++c) {
    // w by value: the piece's product runs again in the backward pass, after this call has returned.
    const H x = local_chunk<Along>(h, c, chunks);  // h first: a refusal names h's type
    const Labels ids = local_chunk<Along>(labels, c, chunks);
    const auto piece = recompute(
        [w, losses, sum_all](const H& piece_h, const Labels& piece_ids) { return sum_all(losses(piece_h, w, piece_ids)); },
        x, ids);
    total = total ? Sum(*total + piece) : piece;
  }
  return Sum(*total * static_cast<F>(1.0 / static_cast<double>(positions)));
}

}  // namespace meshtensor::nn
