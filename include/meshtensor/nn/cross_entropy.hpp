#pragma once
// softmax_cross_entropy<Vocab>(logits, labels): per-example loss
//   logsumexp_Vocab(logits) - logits[label],
// over the logits' dims without Vocab. Vocab may be split: the logsumexp allreduces (max, then
// sum) over its axes, and the label's logit is picked with a one_hot (no communication) and a sum
// over Vocab (one allreduce over its axes). labels: integer (or whole floating) ids with the
// logits' dims minus Vocab and the same layout. Gradient (to the logits): softmax - one_hot, no
// communication. Optional label smoothing (as Mesh-TensorFlow's z_loss-free default):
// targets (1 - s) one_hot + s / |Vocab|.
// Labels over the loss's dims in the same order (the usual case) take fused row kernels
// (kernels/rows.hpp): the same three allreduces, one pass over the logits forward and one
// backward, and no one_hot tensor; with Vocab whole and last and a row-softmax provider
// (kernels/softmax.hpp: oneDNN), its log_softmax forward and softmax backward, vectorised. Other
// label orders are composed of the recording ops.
// NaN: the loss is NaN for every example whose logits hold a NaN, under every layout (the max is
// NaN-propagating and the sum of exponentials takes the NaN; docs/concepts.md, "NaN").
#include "../kernels/softmax.hpp"
#include "../kernels/rows.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/one_hot.hpp"
#include "../ops/sum_broadcast.hpp"
#include "../ops/reductions.hpp"

namespace meshtensor::detail {
template <Dim Vocab, Tensor Logits, Tensor Labels>
auto softmax_cross_entropy_fused(const Logits& logits, const Labels& labels, typename Logits::value_type on,
                                 typename Logits::value_type off) {
  using T = typename Logits::value_type;
  using I = typename Labels::value_type;
  using Mem = typename Logits::memory_space;
  using Exec = typename Logits::execution_space;
  using R = reduced_t<Logits, Vocab>;
  constexpr unsigned axes = reduced_axes<Logits, Vocab>();
  const auto ext = result_extents<R>(logits);
  for (std::size_t i = 0; i < R::rank; ++i)
    if (labels.extents()[i] != ext[i])
      throw shape_error(cat("softmax_cross_entropy: the labels ", Labels::type_name(), labels.shape_string(),
                            " do not match the logits ", Logits::type_name(), logits.shape_string()));
  const row_shape sh = rows_along<Vocab>(logits);
  if constexpr (axes == 0) {
    // Vocab whole and last: the provider's vectorised log_softmax forward and softmax backward
    // (kernels/softmax.hpp) instead of one libm exp per logit in each direction.
    if (sh.inner == 1 && kernels::has_softmax_rows<Exec, T>()) {
      R loss(logits.mesh(), ext, uninitialized);
      {
        Logits logp(logits.mesh(), logits.extents(), uninitialized);
        kernels::softmax_rows<Exec, T>(sh.rows(), sh.n, true, logits.view().data(), logp.view().data());
        for_each_row<Exec>(sh.rows(), xent_logp_rows<T, I, Mem>{logits.view(), logp.view(), loss.view(), labels.view(), sh, on, off});
      }
      record<R>(
          loss,
          [logits, labels, on, off](const R& g) {
            const row_shape gs = rows_along<Vocab>(logits);
            Logits dx(logits.mesh(), logits.extents(), uninitialized);
            kernels::softmax_rows<Exec, T>(gs.rows(), gs.n, false, logits.view().data(), dx.view().data());
            for_each_row<Exec>(gs.rows(), xent_prob_grad_rows<T, I, Mem>{g.view(), dx.view(), labels.view(), gs, on, off});
            push_fresh_grad(logits, std::move(dx));
          },
          logits);
      return loss;
    }
  }
  R m(logits.mesh(), ext, uninitialized), s(logits.mesh(), ext, uninitialized), p(logits.mesh(), ext, uninitialized),
      lse(logits.mesh(), ext, uninitialized), loss(logits.mesh(), ext, uninitialized);
  run_row_phases<Exec>(sh.rows(),
                       xent_rows<T, I, Mem>{logits.view(), m.view(), s.view(), p.view(), lse.view(), loss.view(),
                                            labels.view(), sh, on, off, phase_all},
                       axes != 0, {phase_max, phase_sum, phase_write}, [&](row_phase done) {
                         if (done == phase_max) {
                           allreduce_slice(m, axes, reduce_op::max);
                         } else {
                           allreduce_slice(s, axes, reduce_op::sum);
                           allreduce_slice(p, axes, reduce_op::sum);
                         }
                       });
  record<R>(
      loss,
      [logits, labels, lse, on, off](const R& g) {
        const row_shape gs = rows_along<Vocab>(logits);
        Logits dx(logits.mesh(), logits.extents(), uninitialized);
        for_each_row<Exec>(gs.rows(), xent_grad_rows<T, I, Mem>{logits.view(), g.view(), lse.view(), dx.view(),
                                                                labels.view(), gs, on, off});
        push_fresh_grad(logits, std::move(dx));
      },
      logits);
  return loss;
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <Dim Vocab, Tensor Logits, Tensor Labels>
auto softmax_cross_entropy(const Logits& logits, const Labels& labels, double label_smoothing = 0.0) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"softmax_cross_entropy"});
  using T = typename Logits::value_type;
  static_assert(contains_v<Vocab, typename Logits::dims>, "meshtensor::nn::softmax_cross_entropy: no Vocab dim");
  const std::int64_t n = logits.template extent<Vocab>();
  const T on = static_cast<T>(1.0 - label_smoothing + label_smoothing / static_cast<double>(n));
  const T off = static_cast<T>(label_smoothing / static_cast<double>(n));
  using R = meshtensor::detail::reduced_t<Logits, Vocab>;
  if constexpr (std::is_same_v<Labels, typename R::template rebind<typename Labels::value_type>>) {
    return meshtensor::detail::softmax_cross_entropy_fused<Vocab>(logits, labels, on, off);
  } else {
    const auto targets = one_hot<Vocab, T>(labels, n, on, off);
    return logsumexp<Vocab>(logits) - reduce_sum<Vocab>(logits * targets);
  }
}

}  // namespace meshtensor::nn
