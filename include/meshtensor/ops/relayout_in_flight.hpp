#pragma once
// A relayout (or a replace_dimensions, which is one), started now and finished later:
//
//   auto moving = mt::start_replace_dimensions<mt::type_list<EU, G>, mt::type_list<E, GU>>(t);
//   ... other work ...               // moving->progress() between its ops moves MPI on
//   auto at_experts = moving->wait();  // what replace_dimensions<...>(t) would have given, on the tape alike
//
// Where the relayout is one alltoall (a split moving between dims), the blocks are packed and the
// MPI_Ialltoall(v) posted when it starts, and wait() completes and unpacks it (the dispatch and
// return of mixture-of-experts layers, overlapped with the experts' products chunk by chunk:
// nn/routed_moe.hpp). Any other relayout runs whole when it starts (local slicing moves nothing;
// an allgather has gather_in_flight, ops/gather_for_use.hpp). Every processor must start and wait
// in one order relative to its other collectives (MPI's rule for nonblocking collectives). Open
// MPI moves a nonblocking collective on only inside MPI calls: between start and wait, the MPI
// calls of the work in between (and progress()) are what move it.
// Communication: the relayout's (relayout_plan), counted when it starts. Gradient: the result's
// gradient moved back by the alltoall the other way, started where the backward pass reaches the
// result and landed in x's node when the pass reaches x (autodiff/tape.hpp's arriving_gradient):
// the work done between start and wait forward is what runs while it moves backward, in reverse.
// Any other relayout's gradient is relayout's rule (blocking).
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "rename.hpp"

namespace meshtensor {

namespace detail {

// The gradient of an alltoall started forward, g (an Out) on its way back to x's layout: started
// when made, added into x's node when it lands. Holds g, which MPI may read in place, until then.
template <Tensor Out, Tensor X>
class alltoall_arriving final : public arriving_gradient {
  static constexpr std::size_t R = X::rank;
  using T = typename X::value_type;
  using Exec = typename X::execution_space;

 public:
  alltoall_arriving(grad_node_of<X>* node, const Out& g, axis_set axes)
      : arriving_gradient(node), node_(node), g_(g) {
    auto& comm = g.mesh().communicator();
    const collective_subject subject(&Out::type_name);
    const placement<R> from(Out::splits, comm.shape(), g.extents()), to(X::splits, comm.shape(), g.extents());
    dst_ = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(to.box_at(comm.coords()).size()));
    dst_claim_ = planned_claim(dst_);  // a plan's, until x's gradient claims it
    moving_.emplace(comm, g.view(), from, to, axes, dst_);
    moving_->start();
  }
  void progress() override { moving_->progress(); }
  void land() override {
    {
      const collective_subject subject(&X::type_name);
      moving_->finish();
    }
    moving_.reset();
    X moved(g_.mesh(), g_.extents(), std::move(dst_));  // a relayout keeps the extents
    g_ = Out{};
    dst_claim_.reset();
    node_->accumulate_fresh(std::move(moved).storage());
  }

 private:
  grad_node_of<X>* node_;
  Out g_;
  Kokkos::View<T*, typename Exec::memory_space> dst_;
  std::shared_ptr<void> dst_claim_;
  std::optional<alltoall_exchange<Exec, T, R>> moving_;  // last: destroyed (waited for) before the buffers
};

// relayout_in_flight's gradient rule: relayout's, with the way back, where it is one alltoall,
// started and left with x's node (alltoall_arriving) rather than run blocking.
template <Tensor Out, Tensor X>
struct relayout_started_rule : relayout_rule<Out, X> {
  void operator()(const Out& g) const {
    constexpr auto back = analyze_relayout<X::rank>(Out::splits, X::splits);
    if constexpr (back.kind == relayout_kind::alltoall) {
      if (auto* node = this->x.node()) {
        node->arriving.push_back(std::make_unique<alltoall_arriving<Out, X>>(node, g, back.axes));
        return;
      }
    }
    relayout_rule<Out, X>::operator()(g);
  }
};

}  // namespace detail

template <Tensor Out, Tensor X>
class relayout_in_flight {
  static constexpr std::size_t R = X::rank;
  static constexpr auto step = analyze_relayout<R>(X::splits, Out::splits);
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  using view_type = Kokkos::View<T*, typename Exec::memory_space>;

 public:
  // x's data is held only while the exchange reads it (its node, for the tape, after).
  relayout_in_flight(const X& x, const char* op)
      : x_(step.kind == relayout_kind::alltoall ? x : detail::node_only(x)), op_(op) {
    static_assert(Out::rank == R && std::is_same_v<T, typename Out::value_type> &&
                      std::is_same_v<Exec, typename Out::execution_space>,
                  "meshtensor: relayout_in_flight moves a tensor to another layout (dims renamed at most)");
    const detail::op_call call(detail::planned_op{op_, relayout_plan<Out, X>()}, x);
    if constexpr (step.kind != relayout_kind::alltoall) {
      ready_.emplace(finished(detail::relayout_kernel<Out>(x, op_)));
    } else {
      auto& comm = x.mesh().communicator();
      const detail::collective_subject subject(&X::type_name);
      const placement<R> from(X::splits, comm.shape(), x.extents()), to(Out::splits, comm.shape(), x.extents());
      detail::check_relayout_counts(comm, from, to, x.extents(), step);
      dst_ = detail::view_pool<T, typename Exec::memory_space>::get().allocate(
          static_cast<std::size_t>(to.box_at(comm.coords()).size()));
      dst_claim_ = detail::planned_claim(dst_);  // a plan's, until the result's tensor claims it
      moving_.emplace(comm, x.view(), from, to, step.axes, dst_);
      moving_->start();
    }
  }
  relayout_in_flight(const relayout_in_flight&) = delete;
  relayout_in_flight& operator=(const relayout_in_flight&) = delete;
  relayout_in_flight(relayout_in_flight&&) = delete;  // MPI holds the buffers' addresses
  relayout_in_flight& operator=(relayout_in_flight&&) = delete;

  // One MPI_Test: call it between the ops of the work the exchange overlaps.
  void progress() {
    if (moving_) moving_->progress();
  }

  // The relayouted tensor (once).
  Out wait() {
    if (ready_) return *std::exchange(ready_, std::nullopt);
    if (!moving_) throw error(detail::cat("relayout_in_flight<", Out::type_name(), ">: waited for twice"));
    // Finishing counts nothing: the alltoall was counted when it started.
    const detail::op_call call(detail::planned_op{op_, comm_plan{}}, x_);
    {
      const detail::collective_subject subject(&X::type_name);
      moving_->finish();
    }
    moving_.reset();
    x_ = detail::node_only(x_);
    Out out = finished(Out(x_.mesh(), x_.extents(), std::move(dst_)));
    dst_claim_.reset();
    return out;
  }

 private:
  X x_;
  const char* op_;
  std::optional<Out> ready_;
  view_type dst_;
  std::shared_ptr<void> dst_claim_;
  std::optional<detail::alltoall_exchange<Exec, T, R>> moving_;

  Out finished(Out out) const {
    detail::record<Out>(out, detail::relayout_started_rule<Out, X>{{detail::node_only(x_)}}, x_);
    return out;
  }
};

// replace_dimensions<OldList, NewList>(x) (renaming dim by dim), started.
template <class OldList, class NewList, Tensor X>
auto start_replace_dimensions(const X& x) {
  static_assert(OldList::size == NewList::size,
                "meshtensor: start_replace_dimensions renames dim by dim: as many new dims as old ones");
  using Out = detail::renamed_t<X, OldList, NewList>;
  return std::make_unique<relayout_in_flight<Out, X>>(x, "replace_dimensions");
}

}  // namespace meshtensor
