#pragma once
// sharded<Inner, Shard>: Inner (sgd, adam, adafactor) with its state split over the mesh as the
// layout Shard splits each parameter, while the parameters and their gradients stay as they are
// (ZeRO stage 1, "optimizer state partitioning"). Each step, each processor takes its part of
// the parameter and of its gradient (local slicing: no communication), updates that part with
// Inner's rule and its part of the state, and the parts are gathered back into the parameter (one
// allgather per parameter over the axes Shard adds).
//
//   using shard_layout = mt::layout<grid, mt::split<d_model, rows, cols>>;  // the batch's axes
//   mt::optim::sharded<mt::optim::adam, shard_layout> opt(mt::optim::adam({.lr = 1e-3}));
//   opt.step(std::tie(w1, w2), mt::gradient(loss, w1, w2));
//
// The three ZeRO stages are three choices of types, not three code paths (docs/training.md,
// "Sharded parameters"):
//   stage 1  parameters stored whole, a sharded<Inner, Shard> optimizer: the state is split
//   stage 2  parameters stored under Shard, gathered once per step (gather_for_use) and the
//            gathered copy used by every op: gradients arrive split by reduce_scatter, the
//            optimizer (any, unwrapped) steps on the parts with its state laid out like them
//   stage 3  the same storage, gathered at each use inside the layers (with mt::recompute, again
//            in the backward pass): the whole parameters exist only around their use
// Here the gradients arrive whole (allreduced, as in plain data parallelism), so a stage-1 step
// moves 1.5x the bytes of ZeRO's stage 1, which reduce-scatters them: stage 2 moves ZeRO's bytes.
// The state lives under Shard: a checkpoint of it (io/checkpoint.hpp) names and stores the same
// global tensors as Inner's, so either can resume the other.
#include <utility>

#include "../ops/gather_for_use.hpp"
#include "optimizer.hpp"

namespace meshtensor::optim {

template <class Inner, Layout Shard>
class sharded : public optimizer<sharded<Inner, Shard>> {
 public:
  template <Tensor P>
  using part_type = with_layout_t<P, Shard>;

  sharded() = default;
  explicit sharded(Inner inner) : inner_(std::move(inner)) {}
  const Inner& inner() const { return inner_; }
  void set_lr(double lr) { inner_.set_lr(lr); }

  template <Tensor P>
  auto init(const P& p) const {
    return inner_.init(part_type<P>(p.mesh(), p.extents(), uninitialized));
  }
  template <class S, class F>
  static void visit_state(S& s, F&& f) {
    Inner::visit_state(s, std::forward<F>(f));
  }
  // The elements this processor updates (the cost model's optimizer bytes).
  template <Tensor P>
  static std::int64_t updated_size(const P& p) {
    using Part = part_type<P>;
    return placement<Part::rank>(Part::splits, p.mesh().shape(), p.extents()).local_size(p.mesh().communicator().coords());
  }

  template <Tensor P, class S>
  void update(P& p, const P& g, S& s, std::int64_t t) const {
    const no_grad not_recorded;
    auto part = relayout<part_type<P>>(p);
    inner_.update(part, relayout<part_type<P>>(g), s, t);
    const P whole = relayout<P>(part);
    kernels::deep_copy(p.view(), whole.view());
  }

 private:
  Inner inner_{};
};

}  // namespace meshtensor::optim
