#pragma once
// softmax_cross_entropy<Vocab>(logits, labels): per-example loss
//   logsumexp_Vocab(logits) - logits[label],
// over the logits' dims without Vocab. Vocab may be split: the logsumexp allreduces (max, then
// sum) over its axes, and the label's logit is picked with a one_hot (no communication) and a sum
// over Vocab (one allreduce over its axes). labels: integer (or whole floating) ids with the
// logits' dims minus Vocab and the same layout. Gradient (to the logits): softmax - one_hot, from
// the recording ops. Optional label smoothing (as Mesh-TensorFlow's z_loss-free default):
// targets (1 - s) one_hot + s / |Vocab|.
#include "../ops/elementwise.hpp"
#include "../ops/one_hot.hpp"
#include "../ops/reduce.hpp"
#include "../ops/reductions.hpp"

namespace meshtensor::nn {

template <Dim Vocab, Tensor Logits, Tensor Labels>
auto softmax_cross_entropy(const Logits& logits, const Labels& labels, double label_smoothing = 0.0) {
  using T = typename Logits::value_type;
  static_assert(contains_v<Vocab, typename Logits::dims>, "meshtensor::nn::softmax_cross_entropy: no Vocab dim");
  const std::int64_t n = logits.template extent<Vocab>();
  const T on = static_cast<T>(1.0 - label_smoothing + label_smoothing / static_cast<double>(n));
  const T off = static_cast<T>(label_smoothing / static_cast<double>(n));
  const auto targets = one_hot<Vocab, T>(labels, n, on, off);
  return logsumexp<Vocab>(logits) - reduce_sum<Vocab>(logits * targets);
}

}  // namespace meshtensor::nn
