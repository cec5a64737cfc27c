#pragma once
// recompute(block, inputs...): block(inputs...), whose intermediate results are not kept for the
// backward pass but computed again there (Mesh-TensorFlow's recompute_grad, JAX's checkpoint).
// Between the forward and the backward pass only the inputs and the result stay alive, so the
// activation memory of a stack of blocks falls from every intermediate of every block to the
// blocks' inputs plus one block's intermediates, at the cost of a second forward pass of each block
// (its kernels and its collectives) in the backward pass.
//
// The block may use tensors it does not take as inputs (its weights, captured by reference): their
// gradients come out as without recompute. It must compute the same thing when run again: dropout
// is (its mask is a function of seed and step), a block that reads a changing global state is not.
// A block with effects beyond its result (a mixture of experts' loads, a balance loss added to the
// loss) asks recomputing() and keeps them to its first run: the run again is for the gradients.
// Tensors it captures must outlive the gradient() call. Communication: the block's own, twice.
#include <algorithm>
#include <concepts>
#include <functional>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "tape.hpp"

namespace meshtensor {
namespace detail {

inline int& blocks_recomputing() {
  static thread_local int depth = 0;
  return depth;
}

// The nodes that `from` depends on through nodes made after `after` (the block's own): the first
// ones made before it (the block's inputs and captured weights), or, with own, the block's nodes.
inline std::vector<std::shared_ptr<tape_node>> nodes_reached(std::shared_ptr<tape_node> from, std::uint64_t after,
                                                              bool own) {
  std::vector<std::shared_ptr<tape_node>> found, stack{std::move(from)};
  std::unordered_set<tape_node*> seen;
  while (!stack.empty()) {
    auto n = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    const bool is_own = n->id > after;
    if (is_own)
      for (auto& p : n->parents) stack.push_back(p);
    if (is_own == own) found.push_back(std::move(n));
  }
  return found;
}

// The gradient rule of a recomputed block: run it again with recording on, then push g back
// through the nodes that run made, which hands their gradients to the block's inputs and weights.
template <class Block, class... In>
struct recompute_rule {
  Block block;
  std::tuple<In...> inputs;  // kept alive until the backward pass: the only activations stored

  template <Tensor Out>
  void operator()(const Out& g) const {
    const std::uint64_t before = last_node_id();
    Out again = [&] {
      const recording_scope record(true);
      const plan_phase_scope recomputing(plan_phase::recompute);
      const plan_node_scope unnamed(nullptr);  // the block's ops name themselves, as in the forward pass
      struct again_scope {
        again_scope() { ++blocks_recomputing(); }
        ~again_scope() { --blocks_recomputing(); }
      } again_running;
      return std::apply(block, inputs);
    }();
    if (!again.tracks_grad() || again.node()->id <= before) return;
    again.node()->accumulate(g.storage());
    auto own = nodes_reached(again.shared_node(), before, true);
    std::sort(own.begin(), own.end(), [](const auto& x, const auto& y) { return x->id > y->id; });
    for (const auto& n : own) {
      const plan_node_scope op(n->plan_op);
      n->backward();
      n->clear_grad();  // pushed on to older nodes: read no more (the block's inputs and weights are older)
    }
  }
};

}  // namespace detail

// Whether a recomputed block is running again (in the backward pass), not for the first time.
inline bool recomputing() { return detail::blocks_recomputing() > 0; }

template <class Block, Tensor... In>
  requires std::invocable<const Block&, const In&...> && Tensor<std::invoke_result_t<const Block&, const In&...>>
auto recompute(Block block, const In&... inputs) {
  using Out = std::invoke_result_t<const Block&, const In&...>;
  // Not taping (inside a gradient rule, or a block that runs again): nothing to save.
  if (detail::recording_paused()) return block(inputs...);
  const std::uint64_t before = detail::last_node_id();
  Out out = block(inputs...);
  // Nothing on the tape, or the block returned a tensor it was given: nothing to recompute.
  if (!out.tracks_grad() || out.node()->id <= before) return out;
  Out result = out.detached();
  using rule_type = detail::recompute_rule<Block, In...>;
  auto* n = new detail::rule_node<Out, rule_type>(rule_type{std::move(block), std::tuple<In...>(inputs...)});
  detail::attach_node(result.node_slot(), n, out.mesh().shared_communicator(), nullptr, 0);
  // Its parents are the nodes the block depends on from outside; its own nodes go with `out`.
  result.node_slot()->parents = detail::nodes_reached(out.shared_node(), before, false);
  return result;
}

}  // namespace meshtensor
