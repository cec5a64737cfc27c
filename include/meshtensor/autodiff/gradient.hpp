#pragma once
// gradient(loss, params...): reverse-mode gradients of a scalar (rank-0) loss, laid out like the
// params. Communication: whatever the ops' gradient rules need (their headers say which).
#include <algorithm>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "../tensor/init.hpp"
#include "tape.hpp"

namespace meshtensor {

// Each param is a tensor or a std::vector of tensors (layers stacked at run time); the result holds
// the same kinds in the same order.
template <Tensor Loss, Parameter... Params>
std::tuple<Params...> gradient(const Loss& loss, const Params&... params) {
  static_assert(Loss::rank == 0, "meshtensor: gradient() needs a scalar loss; reduce it with reduce_sum first");
  if (!loss.tracks_grad())
    throw error("gradient: the loss does not depend on any tensor that requires gradients");
  // Every node the loss depends on, newest first: reverse creation order is topological.
  std::vector<detail::tape_node*> order;
  std::unordered_set<detail::tape_node*> seen;
  std::vector<detail::tape_node*> stack{loss.node().get()};
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    order.push_back(n);
    for (auto& p : n->parents) stack.push_back(p.get());
  }
  std::sort(order.begin(), order.end(), [](auto* x, auto* y) { return x->id > y->id; });
  for (auto* n : order) n->clear_grad();
  const auto clear = [](const auto& t) {
    if (t.tracks_grad()) t.node()->clear_grad();
  };
  (detail::for_each_tensor(params, clear), ...);

  struct pause {
    bool was = detail::recording_paused();
    pause() { detail::recording_paused() = true; }
    ~pause() { detail::recording_paused() = was; }
  } paused;
  const detail::plan_backward_scope backward;  // a plan's report names these ops "(backward)"
  loss.node()->accumulate(full<Loss>(loss.mesh(), {}, typename Loss::value_type(1)));
  for (auto* n : order) {
    const detail::plan_node_scope op(n->plan_op);
    n->backward();
  }

  const plan_kind_scope as_gradients(memory_kind::gradients);
  const auto gradient_of = [](const auto& t) {
    using TT = std::remove_cvref_t<decltype(t)>;
    if (t.tracks_grad() && t.node()->grad) return detail::clone(*t.node()->grad);
    return TT(t.mesh(), t.extents());
  };
  const auto gradients_of = [&](const auto& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    if constexpr (Tensor<P>) {
      return gradient_of(p);
    } else {
      P gs;
      gs.reserve(p.size());
      for (const auto& t : p) gs.push_back(gradient_of(t));
      return gs;
    }
  };
  auto result = std::tuple<Params...>{gradients_of(params)...};
  for (auto* n : order) n->clear_grad();
  return result;
}

}  // namespace meshtensor
