#pragma once
// The backward pass in two parts, for the pipeline schedules that run them apart
// (pipeline/schedules.hpp: ZB-H1, ZB-V): the input gradient (B), which the previous stage waits
// for, now; the weight gradients (W), which nothing waits for, later, where the schedule has a gap.
//
//   auto w = mt::accumulate_input_gradient(loss, std::tie(x), w1, w2);  // B: x's gradient
//   auto [dx] = mt::take_gradients(x);                                 // sent on at once
//   ...
//   w.run();                                                           // W: w1's and w2's
//   auto [g1, g2] = mt::take_gradients(w1, w2);
//
// Which of a rule's outputs are weight gradients is said by the rule, at run time: it pushes into
// an input that may be a weight through push_weight_grad (autodiff/tape.hpp), and for the inputs
// that are this call's weights the computation is deferred with what it reads (the other operand,
// the output's gradient) and nothing else of the tape. Products, sums onto fewer dims (biases),
// layer norm's scale and bias and an embedding's table defer. A rule that does not (a convolution's
// filter) computes its weight's gradient in B: still correct, W is only smaller.
//
// A node computed from weights alone (a bf16 working copy of a float weight, a weight scaled) is a
// weight too: the products that read it defer, and W, after the deferred work, runs such nodes'
// rules (newest first), which carry their gradients to the weights. Without that, a bf16 model's
// products, whose operands are the copies, would all run in B.
//
// B then W gives one backward pass's gradients: the same kernels on the same operands; only the
// order in which a weight used several times adds its parts differs.
// Communication: B and W together make what one backward pass makes (each op's header says what);
// the weights' partial sums over data axes stay partial until take_gradients, as with
// accumulate_gradient. A plan reports W's work as "op (weight gradient)".
#include <algorithm>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "gradient.hpp"

namespace meshtensor {

// The weight gradients an input-gradient pass left: run() computes them and adds them into the
// weights' gradients, once. Until then it holds what they read (per product: its other operand and
// its output's gradient), which is the memory a zero-bubble schedule keeps between B and W.
class [[nodiscard]] weight_pass {
 public:
  weight_pass() = default;
  weight_pass(std::vector<std::unique_ptr<detail::deferred_work>> work,
              std::vector<std::shared_ptr<detail::tape_node>> derived_weights)
      : work_(std::move(work)), derived_(std::move(derived_weights)) {}

  // The deferred computations still to run.
  std::size_t pending() const { return work_.size(); }

  void run() {
    const detail::recording_scope paused(false);
    const detail::plan_phase_scope weights(detail::plan_phase::weight_gradient);
    // Taken out first: what each computation holds is freed as soon as it has run, and an error
    // half-way leaves none to run twice.
    auto work = std::move(work_);
    auto derived = std::move(derived_);
    work_.clear();
    derived_.clear();
    for (auto& w : work) {
      {
        const detail::plan_node_scope op(w->plan_op);
        w->run();
      }
      w.reset();
    }
    // The nodes computed from weights (newest first): their gradients, complete now, go on to the
    // weights, and are dropped (a working copy shared by several microbatches gets the next one's).
    for (const auto& n : derived) {
      const detail::plan_node_scope op(n->plan_op);
      n->backward();
      n->clear_grad();
    }
  }

 private:
  std::vector<std::unique_ptr<detail::deferred_work>> work_;
  std::vector<std::shared_ptr<detail::tape_node>> derived_;  // newest first
};

// B: the backward pass of `loss` with the weights' gradient work deferred into the result. The
// inputs (leaves that requires_grad() marked: a pipeline stage's received activation) get their
// gradients added as accumulate_gradient adds them, for take_gradients; the weights' gradients
// are added by the result's run(). Inputs and weights must be leaves.
template <Tensor Loss, class... Inputs, Parameter... Weights>
weight_pass accumulate_input_gradient(const Loss& loss, const std::tuple<Inputs...>& inputs, const Weights&... weights) {
  detail::check_differentiable(loss, "accumulate_input_gradient");
  detail::weight_deferral deferral;
  deferral.weights = detail::leaf_nodes("accumulate_input_gradient", weights...);
  auto kept = std::apply([](const auto&... in) { return detail::leaf_nodes("accumulate_input_gradient", in...); }, inputs);
  const auto refuse_shared = [&](const auto& t) {
    if (t.tracks_grad() && kept.count(t.node()))
      throw error(detail::cat("accumulate_input_gradient: the tensor ", std::remove_cvref_t<decltype(t)>::type_name(),
                              t.shape_string(), " is given both as an input and as a weight"));
  };
  (for_each_tensor(weights, refuse_shared), ...);
  kept.insert(deferral.weights.begin(), deferral.weights.end());
  const auto order = detail::nodes_newest_first(loss.node());
  // Nodes whose parents are all weights are weights too (oldest first: parents come before).
  std::vector<std::shared_ptr<detail::tape_node>> derived;
  for (auto n = order.rbegin(); n != order.rend(); ++n) {
    const auto& parents = (*n)->parents;
    if (parents.empty() || deferral.weights.count(n->get())) continue;
    if (std::all_of(parents.begin(), parents.end(), [&](const auto& p) { return deferral.weights.count(p.get()) > 0; })) {
      deferral.weights.insert(n->get());
      derived.push_back(*n);
    }
  }
  {
    auto& active = detail::weight_deferral::active();
    struct restore {
      detail::weight_deferral*& slot;
      detail::weight_deferral* was;
      ~restore() { slot = was; }
    } const guard{active, active};
    active = &deferral;
    detail::accumulate_into(loss, loss.node(), kept, order);
  }
  std::reverse(derived.begin(), derived.end());
  return weight_pass(std::move(deferral.work), std::move(derived));
}

}  // namespace meshtensor
