#pragma once
// Fully sharded parameters (ZeRO stage 3, PyTorch FSDP) as layouts: a parameter is stored split
// over the data axes (its layout splits a dim of it, d_model say, over the axes that split the
// batch), and gather_for_use<Use>(p) brings it to the layout the op computing with it needs, just
// before the use:
//
//   using stored = mt::tensor<float, shard_layout, d_model, d_ff>;     // d_model over rows, cols
//   using used   = mt::with_layout_t<stored, data_layout>;              // whole on every processor
//   auto y = mt::einsum<batch, length, d_ff>(x, mt::gather_for_use<used>(w));
//
// Communication: one allgather over the axes Use stops splitting dims over (relayout's step, read
// from the same value: relayout_plan<Use, P>). Gradient: the weight gradient of a data-parallel
// product arrives as a sum of partials over the batch's axes (autodiff/tape.hpp); when those are
// exactly the axes gathered, one reduce_scatter sums it and hands each processor its part (ZeRO's
// gradient partitioning, half an allreduce's traffic); otherwise the gradient is reduced first and
// sliced locally (relayout's rule). The optimizer then steps on each processor's part, its state
// laid out like the part (optim/optimizer.hpp): the parameters, gradients and optimizer state are
// all split, and the stored tensors never exist whole outside a use.
//
// The gathered tensor lives as long as something holds it: the op's gradient rule holds its
// operands until the backward pass, so a forward pass over every block holds every gathered
// weight, as ZeRO stage 2 would. Run the block under mt::recompute and only its input is held:
// its gathers run again in the backward pass (FSDP's reshard_after_forward).
#include <optional>
#include <type_traits>
#include <utility>

#include "cast.hpp"
#include "relayout.hpp"

namespace meshtensor {

// The tensor type TT under layout L2 (same element type, space, mesh and dims).
template <class TT, Layout L2>
struct with_layout;
template <class T, Layout L, class E, Dim... Ds, Layout L2>
struct with_layout<basic_tensor<T, L, E, Ds...>, L2> {
  using type = basic_tensor<T, L2, E, Ds...>;
};
template <class TT, Layout L2>
using with_layout_t = typename with_layout<std::remove_cvref_t<TT>, L2>::type;

namespace diagnostic {
template <class Use, class Stored>
struct gather_for_use_must_only_gather {
  static_assert(sizeof(Use) == 0,
                "meshtensor: gather_for_use<Use>(p): Use must keep p's dims, element type, space and mesh, and "
                "split each dim over a prefix of the axes p's layout splits it over (it only gathers); to move a "
                "split between dims use relayout");
};
}  // namespace diagnostic

namespace detail {
// Whether `use` splits every dim over a prefix of its axes under `stored` (nothing but gathers).
template <std::size_t R>
constexpr bool only_gathers(const std::array<dim_split, R>& stored, const std::array<dim_split, R>& use) {
  for (std::size_t d = 0; d < R; ++d)
    if (common_prefix(stored[d], use[d]) != use[d].count) return false;
  return true;
}
template <class Use, class P>
constexpr bool gather_for_use_ok() {
  if constexpr (relayout_compatible_v<Use, P>) return only_gathers<P::rank>(P::splits, Use::splits);
  else return false;
}
}  // namespace detail

template <Tensor Use, Tensor P>
constexpr comm_plan gather_for_use_plan() {
  return relayout_plan<Use, P>();
}

template <Tensor Use, Tensor P>
Use gather_for_use(const P& p) {
  if constexpr (!detail::gather_for_use_ok<Use, P>()) {
    (void)sizeof(diagnostic::gather_for_use_must_only_gather<Use, P>);
    return Use{};
  } else {
    const detail::op_call call(detail::planned_op{"gather_for_use", gather_for_use_plan<Use, P>()}, p);
    Use out = detail::relayout_kernel<Use>(p, "gather_for_use");
    detail::record<Use>(out, detail::relayout_rule<Use, P>{p}, p);
    return out;
  }
}

// A stored parameter p as a computation under layout L in element type C uses it: p itself; a C
// copy (mixed precision: its gradient flows back to p, the master weight the optimizer updates);
// gathered, where p is stored split (FSDP); or cast to C, then gathered, so that the allgather
// moves C's bytes. The gradient comes back to p in p's layout and type either way.
//
//   auto y = mt::einsum<batch, length, d_ff>(x, mt::use_as<mt::bf16, compute_layout>(w));
template <class C, Layout L, Tensor P>
auto use_as(const P& p) {
  using used = with_layout_t<P, L>;
  if constexpr (std::is_same_v<P, used>) {
    if constexpr (std::is_same_v<C, typename P::value_type>) return p;
    else return cast<C>(p);
  } else if constexpr (std::is_same_v<C, typename P::value_type>) {
    return gather_for_use<used>(p);
  } else {
    return gather_for_use<typename used::template rebind<C>>(cast<C>(p));
  }
}

// gather_for_use, started now and finished later: the allgather runs (MPI_Iallgatherv) while the
// caller computes something else (FSDP's prefetch: the next block's weights while this block
// runs), and wait() gives what gather_for_use<Use>(p) would have, on the tape alike. Every
// processor must start and wait in one order relative to its other collectives (MPI's rule for
// nonblocking collectives). Open MPI moves a nonblocking collective on only inside MPI calls, so
// the overlap it gets is what the collectives made in between (the block's own) let it progress.
// Communication: gather_for_use's, counted when started.
template <Tensor Use, Tensor P>
class gather_in_flight {
 public:
  explicit gather_in_flight(const P& p) : p_(p) {
    if constexpr (!detail::gather_for_use_ok<Use, P>()) {
      (void)sizeof(diagnostic::gather_for_use_must_only_gather<Use, P>);
    } else {
      const detail::op_call call(detail::planned_op{"gather_for_use", gather_for_use_plan<Use, P>()}, p);
      constexpr auto step = analyze_relayout<P::rank>(P::splits, Use::splits);
      if constexpr (step.kind != relayout_kind::allgather) {
        ready_ = gather_for_use<Use>(p);  // nothing to send
      } else {
        auto& comm = p.mesh().communicator();
        const placement<P::rank> from(P::splits, comm.shape(), p.extents()),
            to(Use::splits, comm.shape(), p.extents());
        gather_ = detail::gather_exchange_of<P::rank>(comm, from, to, step.axes);
        send_.emplace(buffers::reading(p.view()));
        received_.emplace(buffers::writing(static_cast<std::size_t>(gather_.total)));
        const detail::collective_subject subject(&P::type_name);
        started_ = start_allgatherv(comm, step.axes, send_->data(), gather_.old_box.size(), received_->data(),
                                    gather_.counts, gather_.displs);
      }
    }
  }
  gather_in_flight(const gather_in_flight&) = delete;
  gather_in_flight& operator=(const gather_in_flight&) = delete;
  gather_in_flight(gather_in_flight&& o) noexcept
      : p_(std::move(o.p_)), ready_(std::move(o.ready_)), gather_(std::move(o.gather_)), send_(std::move(o.send_)),
        received_(std::move(o.received_)), started_(std::exchange(o.started_, started_collective{})) {}
  gather_in_flight& operator=(gather_in_flight&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      p_ = std::move(o.p_);
      ready_ = std::move(o.ready_);
      gather_ = std::move(o.gather_);
      send_ = std::move(o.send_);
      received_ = std::move(o.received_);
      started_ = std::exchange(o.started_, started_collective{});
    }
    return *this;
  }
  ~gather_in_flight() { finish_quietly(); }

  // The gathered tensor (once).
  Use wait() {
    if (ready_) return *std::exchange(ready_, std::nullopt);
    if (!received_) throw error(detail::cat("gather_in_flight<", Use::type_name(), ">: waited for twice"));
    // Finishing counts nothing: the allgather was counted when it started.
    const detail::op_call call(detail::planned_op{"gather_for_use", comm_plan{}}, p_);
    constexpr auto step = analyze_relayout<P::rank>(P::splits, Use::splits);
    auto& comm = p_.mesh().communicator();
    {
      const detail::collective_subject subject(&P::type_name);
      comm.await_started(started_, collective::allgather, step.axes,
                         gather_.old_box.size() * static_cast<std::int64_t>(sizeof(typename P::value_type)));
    }
    view_type dst;
    if (gather_.direct) {
      dst = received_->view();  // the new slice itself
    } else {
      dst = detail::view_pool<typename P::value_type, typename P::memory_space>::get().allocate(
          static_cast<std::size_t>(gather_.new_box.size()));
      detail::unpack_gathered<typename P::execution_space>(gather_, received_->view().data(), dst.data());
    }
    send_.reset();
    received_.reset();
    Use out(p_.mesh(), p_.extents(), std::move(dst));
    detail::record<Use>(out, detail::relayout_rule<Use, P>{p_}, p_);
    return out;
  }

 private:
  using buffers = detail::mpi_buffer<typename P::execution_space, typename P::value_type>;
  using view_type = Kokkos::View<typename P::value_type*, typename P::memory_space>;
  P p_;
  std::optional<Use> ready_;
  detail::gather_exchange<P::rank> gather_;
  std::optional<buffers> send_, received_;
  started_collective started_;

  // Only reached unfinished when an error left the caller early: MPI still writes the buffer.
  void finish_quietly() noexcept {
    if (started_.request != MPI_REQUEST_NULL) MPI_Wait(&started_.request, MPI_STATUS_IGNORE);
  }
};

template <Tensor Use, Tensor P>
gather_in_flight<Use, P> start_gather_for_use(const P& p) {
  return gather_in_flight<Use, P>(p);
}

}  // namespace meshtensor
