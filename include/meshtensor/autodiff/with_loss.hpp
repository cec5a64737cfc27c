#pragma once
// with_loss(y, extra): y, with the scalar `extra` added to the loss that y flows into, as far as
// gradients go: the result's value is y's; in the backward pass y gets the result's gradient and
// extra gets 1 (d loss / d extra, the loss being what gradient() was asked for). A mixture of
// experts' balance loss made inside a block rides on the block's output this way, so that a
// recomputed block (recompute.hpp) computes it again with everything else and keeps none of its
// inputs alive between the passes (Megatron-Core's MoEAuxLossAutoScaler). Its value is not in any
// loss: add extra.detached() to the loss you report. A loss that is scaled after the fact (a
// microbatch's loss over the count) needs extra scaled alike before it is attached. Where the
// result takes no gradient (nothing the loss depends on reads it), extra takes none either.
#include "../tensor/init.hpp"
#include "tape.hpp"

namespace meshtensor {
namespace detail {

template <Tensor Y, Tensor L>
struct with_loss_rule {
  Y y;     // node only
  L extra;  // node only
  void operator()(const Y& g) const {
    push_grad(y, g);
    if (extra.tracks_grad()) push_fresh_grad(extra, full<L>(extra.mesh(), {}, typename L::value_type(1)));
  }
};

}  // namespace detail

template <Tensor Y, Tensor L>
Y with_loss(const Y& y, const L& extra) {
  static_assert(L::rank == 0, "meshtensor::with_loss: the extra loss is a scalar (a rank-0 tensor)");
  Y out = y.detached();
  detail::record<Y>(out, detail::with_loss_rule<Y, L>{detail::node_only(y), detail::node_only(extra)}, y, extra);
  return out;
}

}  // namespace meshtensor
