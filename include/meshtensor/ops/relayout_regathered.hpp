#pragma once
// relayout_regathered<Out>(x): relayout<Out>(x), whose result a product's gradient rule does not
// keep: the rule keeps x (its node and x's slices) and gathers it again when it runs, once for all
// the products that read the result. Sequence parallelism's way to store a block's input (Megatron-LM,
// Korthikanti et al. 2022): between the forward and the backward pass each processor holds its
// 1/t part of the gathered [batch, length, d_model] input of attention's and the feed-forward's
// first products, not the whole; the backward pass pays one more allgather per input.
// Only products (einsum and what is built on it: dense, attention, feed_forward) keep the result
// this way; another op that saves it keeps it whole. A result with a source is on the tape, which
// update_slice refuses, so nothing writes over what the backward pass gathers again.
// Communication: relayout's in the forward pass; in the backward pass relayout's gradient (a
// reduce_scatter of a partial gradient, ops/relayout.hpp) and relayout's again (relayout_plan).
#include <memory>

#include "../autodiff/saved_operand.hpp"
#include "relayout.hpp"

namespace meshtensor {
namespace detail {

// x's slices, gathered again as Out when a rule asks (off the tape: rules record nothing).
template <Tensor Out, Tensor X>
struct gathered_source final : slice_source<typename Out::value_type, Out::rank, typename Out::execution_space> {
  X x;
  explicit gathered_source(X kept) : x(std::move(kept)) {}
  typename Out::storage_type make() const override {
    const recording_scope off(false);
    return relayout<Out>(x).storage();
  }
};

}  // namespace detail

// Gradient: relayout's.
template <Tensor Out, Tensor X>
Out relayout_regathered(const X& x) {
  Out out = relayout<Out>(x);
  // Off the tape (no gradient, or inside a rule): no rule will keep it.
  if (!out.tracks_grad() || detail::recording_paused()) return out;
  auto st = out.storage();
  st.source = std::make_shared<detail::gathered_source<Out, X>>(detail::without_node(x));
  return Out(detail::from_storage, out.mesh().shared_communicator(), st);
}

}  // namespace meshtensor
