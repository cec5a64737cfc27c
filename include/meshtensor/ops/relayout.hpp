#pragma once
// relayout<Target>(x): the same global tensor (same dims, element type, space and mesh) under
// Target's layout.
// Communication, from the two layouts' splits dim by dim: none where every dim's new axes extend
// its old ones (local slicing, or none at all when nothing changes); one alltoall over axes A when
// dims drop axes A from the end of their axes and other dims take all of A up (a split moving
// between dims, over one axis or several), besides such slicing; otherwise one allgather over the
// axes every dim stops being split over (its old axes after the prefix it keeps), then local
// slicing. Where either layout cuts a dim zigzag (two ranges per processor): one alltoall over the
// axes of the dims that change, piece by piece (move_pieces).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../geometry/split.hpp"
#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "../kernels/pool.hpp"
#include "../kernels/copy_region.hpp"
#include "../autodiff/gradient_reduction.hpp"
#include "cast.hpp"
#include "detail/op_support.hpp"
#include "sum_broadcast.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Target, class Source>
struct relayout_changes_more_than_layout {
  static_assert(sizeof(Target) == 0,
                "meshtensor: relayout<Target> must keep the tensor's dims (in order), element type, "
                "execution space and mesh; only the layout may change");
};
}  // namespace diagnostic

namespace detail {

constexpr comm_plan plan_of(const relayout_step& s) {
  comm_plan p{};
  if (s.kind == relayout_kind::allgather) p.then(collective::allgather, s.axes);
  if (s.kind == relayout_kind::alltoall || s.kind == relayout_kind::general) p.then(collective::alltoall, s.axes);
  return p;
}

// This processor's slice under `to`, from its slice `src` under `from`, global extents ext.
// Templated on element type, space and rank only: the layouts are values here, and the copy
// kernel (copy_region) is per (space, element type).
// Copies: the packing and unpacking around the collective copy contiguous runs (copy_region), and
// are skipped where the blocks already lie in the collective's order: the alltoall sends from the
// slice itself when each peer's block is a contiguous range of it at its sub-rank's position, and
// either collective receives straight into the result when each peer's block lands as a
// contiguous range at its sub-rank's position (checked per block, never assumed: a dim split over
// axes in an order other than the mesh's numbers its parts unlike the sub-communicator's ranks).
// The result and the send or receive buffer that remains come from the tensor memory cache
// (kernels/pool.hpp): the buffers live only during the call, and fresh ones cost page faults and
// the kernel's zeroing of every page each call.
// MPI reads and writes through mpi_buffer (tensor/mpi_buffer.hpp): the data's own memory, or
// pinned host buffers for a device that the MPI cannot reach.
// An allgather step's exchange (geometry/exchange.hpp): every peer's old slice, back to back in the
// received buffer, and whether that buffer already is the new slice (direct) or each peer's part
// must be copied into it (unpack_gathered).
template <std::size_t R>
struct gather_exchange : exchange<R> {
  box<R> old_box, new_box;
  bool direct = false;
};
template <std::size_t R>
gather_exchange<R> gather_exchange_of(const communicator& comm, const placement<R>& from, const placement<R>& to,
                                      axis_set axes) {
  gather_exchange<R> g;
  static_cast<exchange<R>&>(g) = exchange<R>(peer_boxes(from, comm.shape(), comm.coords(), axes));
  g.old_box = from.box_at(comm.coords());
  g.new_box = to.box_at(comm.coords());
  g.direct = g.packs_as(g.new_box);
  return g;
}
template <class Exec, class T, std::size_t R>
void unpack_gathered(const gather_exchange<R>& g, const T* received, T* dst) {
  for (std::size_t p = 0; p < g.boxes.size(); ++p)
    copy_region<Exec>(received, g.displs[p], g.boxes[p], dst, 0, g.new_box, intersect(g.boxes[p], g.new_box));
}

// The general step (a zigzag side, geometry/split.hpp): one alltoallv over `axes`, piece by piece.
// Several peers may hold an element under `from` (replicas along axes of the group that `from`
// splits nothing over); the one that agrees with the receiver on those axes sends it, so each
// element arrives once. A block is the overlaps of the sender's pieces with the receiver's, from's
// outer (for_each_overlap's order, alike on both ends), copied through each piece's frame.
template <class Exec, class T, std::size_t R>
void move_pieces(communicator& comm, const T* src, T* dst, const placement<R>& from, const placement<R>& to,
                 axis_set axes) {
  using mem = typename Exec::memory_space;
  using buffers = mpi_buffer<Exec, T>;
  const auto& shape = comm.shape();
  unsigned from_axes = 0;
  for (const auto& s : from.splits()) from_axes |= s.mask();
  const unsigned replica_axes = axes.bits & ~from_axes;
  const auto mine = comm.coords();
  const auto my_from = from.pieces_at(mine), my_to = to.pieces_at(mine);
  const int n = comm.size_over(axes);
  std::vector<std::vector<piece<R>>> peer_from(n), peer_to(n);
  std::vector<std::int64_t> send_sizes(n, 0), recv_sizes(n, 0);
  for (int q = 0; q < n; ++q) {
    const auto c = shape.peer_coords(mine, axes, q);
    bool same_replica = true;
    for (std::size_t a = 0; a < c.size(); ++a)
      if (((replica_axes >> a) & 1u) != 0 && c[a] != mine[a]) same_replica = false;
    if (!same_replica) continue;
    peer_from[q] = from.pieces_at(c);
    peer_to[q] = to.pieces_at(c);
    for_each_overlap(my_from, peer_to[q], [&](const auto&, const auto&, const box<R>& r) { send_sizes[q] += r.size(); });
    for_each_overlap(peer_from[q], my_to, [&](const auto&, const auto&, const box<R>& r) { recv_sizes[q] += r.size(); });
  }
  const exchange_blocks sends(send_sizes), receives(recv_sizes);
  auto& pool = view_pool<T, mem>::get();
  const auto send = pool.allocate(static_cast<std::size_t>(sends.total));
  for (int q = 0; q < n; ++q) {
    std::int64_t at = sends.displs[q];
    for_each_overlap(my_from, peer_to[q], [&](const piece<R>& a, const piece<R>&, const box<R>& r) {
      copy_region<Exec>(src, 0, a.frame, send.data(), at, r, r);
      at += r.size();
    });
  }
  const auto send_h = buffers::reading(send);
  const auto received = buffers::writing(static_cast<std::size_t>(receives.total));
  alltoallv(comm, axes, false, send_h.data(), sends.counts, sends.displs, received.data(), receives.counts,
            receives.displs);
  const auto recv = received.view();
  for (int q = 0; q < n; ++q) {
    std::int64_t at = receives.displs[q];
    for_each_overlap(peer_from[q], my_to, [&](const piece<R>&, const piece<R>& b, const box<R>& r) {
      copy_region<Exec>(recv.data(), at, r, dst, 0, b.frame, r);
      at += r.size();
    });
  }
}

// MPI's counts and displacements are ints. Every block and displacement of a relayout's alltoall
// lies within one processor's old or new slice, and an allgather's within the old slices of its
// group, so these bounds hold them all; they are the same on every rank, so every rank refuses
// alike (a count checked per rank would throw on the ranks with the large blocks and leave their
// peers in the collective). (A plan moves nothing: it plans tensors no run could move this way,
// as it plans memory no card has.)
template <std::size_t R>
void check_relayout_counts(const communicator& comm, const placement<R>& from, const placement<R>& to,
                           const std::array<std::int64_t, R>& ext, relayout_step step) {
  const std::int64_t largest = step.kind == relayout_kind::allgather
                                   ? from.max_local_size() * comm.size_over(step.axes)
                                   : std::max(from.max_local_size(), to.max_local_size());
  if (step.kind != relayout_kind::local && largest > INT32_MAX && !comm.planned()) {
    std::string extents;
    for (const auto e : ext) extents += cat(extents.empty() ? "[" : " x ", e);
    throw error(cat("meshtensor: a relayout of a tensor of extents ", extents, "] moves slices of up to ", largest,
                    " elements, past MPI's int count (2147483647): split it over more processors"));
  }
}

// The elements of this processor's slice where it is the same box under both layouts and the step's
// collective, if any, runs over a group of one (one processor; axes of size 1): the result is then
// the source itself. Else none. Zigzag layouts (two ranges per processor) move through their pieces.
template <std::size_t R>
std::optional<std::int64_t> kept_alone(const communicator& comm, const placement<R>& from, const placement<R>& to,
                                       relayout_step step) {
  if (from.zigzag() || to.zigzag() || (step.kind != relayout_kind::local && comm.size_over(step.axes) != 1))
    return std::nullopt;
  const auto mine = from.box_at(comm.coords());
  if (!(mine == to.box_at(comm.coords()))) return std::nullopt;
  return mine.size();
}

// A relayout's alltoall step (sub-rank q gets old slice ∩ its new slice and sends new slice ∩ its
// old slice) into dst, this processor's new slice: constructed, the blocks are packed (where they
// do not already lie in the collective's order in the slice) and MPI's buffers readied; run() is
// the blocking collective and the unpacking, start() and finish() the same in two halves, so that
// other work runs between them (relayout_in_flight). The buffers live until the unpacking.
template <class Exec, class T, std::size_t R>
class alltoall_exchange {
  using mem = typename Exec::memory_space;
  using view = Kokkos::View<T*, mem>;
  using buffers = mpi_buffer<Exec, T>;

 public:
  alltoall_exchange(communicator& comm, const view& src, const placement<R>& from, const placement<R>& to,
                    axis_set axes, view dst)
      : comm_(&comm), axes_(axes), dst_(std::move(dst)), new_box_(to.box_at(comm.coords())) {
    const auto& shape = comm.shape();
    const auto old_box = from.box_at(comm.coords());
    const int n = comm.size_over(axes);
    std::vector<box<R>> send_boxes(n), recv_boxes(n);
    for (int q = 0; q < n; ++q) {
      const auto c = shape.peer_coords(comm.coords(), axes, q);
      send_boxes[q] = intersect(old_box, to.box_at(c));
      recv_boxes[q] = intersect(from.box_at(c), new_box_);
    }
    // One block size between every pair of the sub-communicator (every rank of it computes the
    // same, from the placements alone): an MPI_Alltoall, as with even splits; else MPI_Alltoallv.
    // Even splits have it by construction; otherwise compare every pair's block (n^2 boxes).
    const bool even = from.even() && to.even();
    std::int64_t block = -1;  // the block between sub-ranks 0 and 0, the same on every rank
    for (int p = 0; p < n && uniform_ && !even; ++p) {
      const auto old_p = from.box_at(shape.peer_coords(comm.coords(), axes, p));
      for (int q = 0; q < n && uniform_; ++q) {
        const auto size = intersect(old_p, to.box_at(shape.peer_coords(comm.coords(), axes, q))).size();
        if (block < 0) block = size;
        uniform_ = size == block;
      }
    }
    sends_ = exchange<R>(std::move(send_boxes));
    receives_ = exchange<R>(std::move(recv_boxes));
    const bool send_direct = sends_.in_place_in(old_box);
    recv_direct_ = receives_.in_place_in(new_box_);
    view packed;
    if (!send_direct) {
      packed = view_pool<T, mem>::get().allocate(static_cast<std::size_t>(sends_.total));
      send_claim_ = planned_claim(packed);
      for (int q = 0; q < n; ++q)
        copy_region<Exec>(src.data(), 0, old_box, packed.data(), sends_.displs[q], sends_.boxes[q], sends_.boxes[q]);
    }
    send_.emplace(buffers::reading(send_direct ? src : packed));
    if (recv_direct_) {
      received_.emplace(buffers::receiving_into(dst_));  // MPI writes the result itself
    } else {
      received_.emplace(buffers::writing(static_cast<std::size_t>(receives_.total)));
      received_claim_ = planned_claim_of_buffer(*received_);
    }
  }
  alltoall_exchange(const alltoall_exchange&) = delete;
  alltoall_exchange& operator=(const alltoall_exchange&) = delete;
  // Only reached unfinished when an error left the caller early: MPI still reads and writes the buffers.
  ~alltoall_exchange() {
    if (started_.request != MPI_REQUEST_NULL) MPI_Wait(&started_.request, MPI_STATUS_IGNORE);
  }

  void run() {
    alltoallv(*comm_, axes_, uniform_, send_->data(), sends_.counts, sends_.displs, received_->data(), receives_.counts,
              receives_.displs);
    unpack();
  }
  void start() {
    started_ = start_alltoallv(*comm_, axes_, uniform_, send_->data(), sends_.counts, sends_.displs, received_->data(),
                               receives_.counts, receives_.displs);
  }
  // Moves MPI on (Open MPI progresses a nonblocking collective only inside MPI calls).
  void progress() {
    int done = 0;
    if (started_.request != MPI_REQUEST_NULL) MPI_Test(&started_.request, &done, MPI_STATUS_IGNORE);
  }
  void finish() {
    comm_->await_started(started_, collective::alltoall, axes_, sends_.total * static_cast<std::int64_t>(sizeof(T)));
    unpack();
  }

 private:
  communicator* comm_;
  axis_set axes_;
  view dst_;
  box<R> new_box_;
  bool uniform_ = true, recv_direct_ = false;
  exchange<R> sends_, receives_;
  std::shared_ptr<void> send_claim_, received_claim_;  // a plan's claims on the buffers while they live
  std::optional<buffers> send_, received_;
  started_collective started_;

  void unpack() {
    if (recv_direct_) {
      received_->copy_into(dst_);
    } else {
      const auto recv = received_->view();
      for (std::size_t q = 0; q < receives_.boxes.size(); ++q)
        copy_region<Exec>(recv.data(), receives_.displs[q], receives_.boxes[q], dst_.data(), 0, new_box_,
                          receives_.boxes[q]);
    }
    send_.reset();
    received_.reset();
    send_claim_.reset();
    received_claim_.reset();
  }
};

template <class Exec, class T, std::size_t R>
Kokkos::View<T*, typename Exec::memory_space> move_slices(communicator& comm,
                                                          const Kokkos::View<T*, typename Exec::memory_space>& src,
                                                          const std::array<std::int64_t, R>& ext,
                                                          const std::array<dim_split, R>& from_splits,
                                                          const std::array<dim_split, R>& to_splits, relayout_step step) {
  using mem = typename Exec::memory_space;
  using view = Kokkos::View<T*, mem>;
  using buffers = mpi_buffer<Exec, T>;
  if (step.kind == relayout_kind::share) return src;
  const auto& shape = comm.shape();
  const placement<R> from(from_splits, shape, ext), to(to_splits, shape, ext);
  check_relayout_counts(comm, from, to, ext, step);
  if (const auto kept = kept_alone(comm, from, to, step)) {
    // The collective over a group of one is counted, as a plan counts it; nothing is copied.
    const auto kind = step.kind == relayout_kind::allgather ? collective::allgather : collective::alltoall;
    if (step.kind != relayout_kind::local)
      comm.run({kind, step.axes, *kept * static_cast<std::int64_t>(sizeof(T)), true}, [] {}, [](MPI_Request*) {});
    return src;
  }
  if (step.kind == relayout_kind::general) {
    view dst = view_pool<T, mem>::get().allocate(static_cast<std::size_t>(to.local_size(comm.coords())));
    const auto dst_claim = planned_claim(dst);  // a plan's, until the result's tensor claims it
    move_pieces<Exec>(comm, src.data(), dst.data(), from, to, step.axes);
    return dst;
  }
  if (step.kind == relayout_kind::local && (from.zigzag() || to.zigzag())) {  // pieces inside pieces
    const auto mine = comm.coords();
    view dst = view_pool<T, mem>::get().allocate(static_cast<std::size_t>(to.local_size(mine)));
    const auto dst_claim = planned_claim(dst);
    for_each_overlap(from.pieces_at(mine), to.pieces_at(mine), [&](const piece<R>& a, const piece<R>& b, const box<R>& r) {
      copy_region<Exec>(src.data(), 0, a.frame, dst.data(), 0, b.frame, r);
    });
    return dst;
  }
  const auto old_box = from.box_at(comm.coords());
  const auto new_box = to.box_at(comm.coords());
  auto buffer = [](auto space, std::int64_t n) {
    return view_pool<T, decltype(space)>::get().allocate(static_cast<std::size_t>(n));
  };
  view dst = buffer(mem{}, new_box.size());
  // A plan's claims on the buffers below while they live (the result's until its tensor claims it).
  const auto dst_claim = planned_claim(dst);
  // MPI writes the result itself where it can, else a staging buffer copied into it.
  auto receive_into_result = [&](auto&& collective) {
    const auto received = buffers::receiving_into(dst);
    collective(received.data());
    received.copy_into(dst);
  };
  if (step.kind == relayout_kind::local) {
    copy_region<Exec>(src.data(), 0, old_box, dst.data(), 0, new_box, new_box);
  } else if (step.kind == relayout_kind::allgather) {
    const auto g = gather_exchange_of<R>(comm, from, to, step.axes);
    const auto send = buffers::reading(src);
    if (g.direct) {
      receive_into_result([&](T* recv) { allgatherv(comm, step.axes, send.data(), old_box.size(), recv, g.counts, g.displs); });
    } else {
      const auto received = buffers::writing(static_cast<std::size_t>(g.total));
      const auto received_claim = planned_claim_of_buffer(received);
      allgatherv(comm, step.axes, send.data(), old_box.size(), received.data(), g.counts, g.displs);
      unpack_gathered<Exec>(g, received.view().data(), dst.data());
    }
  } else {
    alltoall_exchange<Exec, T, R> moved(comm, src, from, to, step.axes, dst);
    moved.run();
  }
  return dst;
}

// x's global tensor placed as Out, dim i of Out taking dim i of x (names may differ: rename uses
// this). Not recorded.
template <Tensor Out, Tensor X>
Out relayout_kernel(const X& x, const char* op) {
  static_assert(Out::rank == X::rank);
  constexpr auto step = analyze_relayout<X::rank>(X::splits, Out::splits);
  auto& comm = x.mesh().communicator();
  const collective_subject subject(&X::type_name);
  (void)op;
  auto v = move_slices<typename X::execution_space, typename X::value_type, X::rank>(comm, x.view(), x.extents(),
                                                                                     X::splits, Out::splits, step);
  return Out(x.mesh(), x.extents(), std::move(v));
}

// An addend packed for a reduce_scatter over axes into Out's layout: its pieces in the order of the
// peers that own them (sub-rank order), with each peer's count, and the result to receive into.
template <Tensor Out, Tensor X>
struct scatter_packing {
  using Exec = typename X::execution_space;
  using T = typename X::value_type;
  Kokkos::View<T*, typename Exec::memory_space> packed;
  std::shared_ptr<void> packed_claim;  // a plan's, while the run holds it
  std::vector<int> counts;
  Out out;

  scatter_packing(const X& addend, axis_set axes) {
    constexpr std::size_t R = X::rank;
    auto& comm = addend.mesh().communicator();
    const auto& shape = comm.shape();
    const placement<R> from(X::splits, shape, addend.extents()), to(Out::splits, shape, addend.extents());
    const auto old_box = from.box_at(comm.coords());
    const exchange<R> parts(peer_boxes(to, shape, comm.coords(), axes));
    packed = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(parts.total));
    packed_claim = planned_claim(packed);
    for (std::size_t p = 0; p < parts.peers(); ++p)
      copy_region<Exec>(addend.view().data(), 0, old_box, packed.data(), parts.displs[p], parts.boxes[p], parts.boxes[p]);
    counts = parts.counts;
    out = Out(addend.mesh(), addend.extents(), uninitialized);
  }
};

// The addends' sum, with each processor along Axes receiving only its part under Out: one
// MPI_Reduce_scatter of the packed pieces. Not recorded.
template <Tensor Out, Tensor X>
Out reduce_scatter_kernel(const X& addend, axis_set axes) {
  const collective_subject subject(&X::type_name);
  using Exec = typename X::execution_space;
  using T = typename X::value_type;
  scatter_packing<Out, X> pack(addend, axes);
  const auto send = mpi_buffer<Exec, T>::reading(pack.packed);
  const auto received = mpi_buffer<Exec, T>::receiving_into(pack.out.view());
  reduce_scatter_v(addend.mesh().communicator(), axes, send.data(), received.data(), pack.counts);
  received.copy_into(pack.out.view());
  return std::move(pack.out);
}

// reduce_scatter_kernel started (MPI_Ireduce_scatter) for a parameter's gradient (an X, from the
// addend G): on its way to the parameter's node while the backward pass goes on, added there when
// it lands (autodiff/tape.hpp's arriving_gradient). Holds the packed addend and the result until then.
template <Tensor X, Tensor G>
class reduce_scatter_arriving final : public arriving_gradient {
 public:
  reduce_scatter_arriving(grad_node_of<X>* node, const G& addend, axis_set axes)
      : arriving_gradient(node), node_(node), comm_(&addend.mesh().communicator()), axes_(axes), pack_(addend, axes),
        send_(buffer::reading(pack_.packed)), received_(buffer::receiving_into(pack_.out.view())) {
    const collective_subject subject(&G::type_name);
    started_ = start_reduce_scatter_v(*comm_, axes_, send_.data(), received_.data(), pack_.counts);
  }
  ~reduce_scatter_arriving() override {
    if (started_.request != MPI_REQUEST_NULL) MPI_Wait(&started_.request, MPI_STATUS_IGNORE);
  }
  void progress() override {
    int done = 0;
    if (started_.request != MPI_REQUEST_NULL) MPI_Test(&started_.request, &done, MPI_STATUS_IGNORE);
  }
  void land() override {
    const collective_subject subject(&X::type_name);
    std::int64_t n = 0;
    for (const int k : pack_.counts) n += k;
    comm_->await_started(started_, collective::reduce_scatter, axes_, n * static_cast<std::int64_t>(sizeof(T)));
    received_.copy_into(pack_.out.view());
    node_->accumulate_fresh(std::move(pack_.out).storage());
  }

 private:
  using T = typename X::value_type;
  using buffer = mpi_buffer<typename X::execution_space, T>;
  grad_node_of<X>* node_;
  communicator* comm_;
  axis_set axes_;
  scatter_packing<X, G> pack_;
  buffer send_, received_;
  started_collective started_;
};

// A parameter's gradient summed behind the rest of the backward pass (gradient_reduction's
// overlap): where x is a leaf whose gradient the pass hands out, the reduce_scatter is started and
// lands in x's node; where x is a bf16 copy of such a float leaf (a weight's working copy, cast
// before its gather), it is summed in float and lands in the float leaf's node, where the
// products' gradient-accumulation fusion writes too (ops/cast.hpp, float_gradient_of). Else false:
// the caller reduces it now.
template <Tensor X, Tensor G>
bool start_sum_behind_pass(const X& x, const G& g, axis_set axes) {
  const gradient_reduction& settings = gradient_reduction_settings();
  if (!settings.overlap || !x.tracks_grad()) return false;
  const auto* read = nodes_read_after_pass();
  const auto handed_out = [&](const tape_node* n) { return n && n->parents.empty() && read && read->count(n); };
  const auto make_room = [&] {  // the oldest sums land first (gradient_reduction::sums_in_flight)
    auto& moving = arriving_gradient::in_flight();
    while (!moving.empty() && static_cast<int>(moving.size()) >= settings.sums_in_flight)
      moving.front()->owner->land_arrivals();
  };
  if constexpr (std::is_same_v<typename X::value_type, bf16>) {
    auto* master = float_gradient_of(x);
    if (!handed_out(master)) return false;
    make_room();
    using XF = typename X::template rebind<float>;
    using GF = typename G::template rebind<float>;
    master->arriving.push_back(std::make_unique<reduce_scatter_arriving<XF, GF>>(master, cast_local<float>(g), axes));
  } else {
    if (!handed_out(x.node())) return false;
    make_room();
    x.node()->arriving.push_back(std::make_unique<reduce_scatter_arriving<X, G>>(x.node(), g, axes));
  }
  return true;
}

template <class Out, class X>
constexpr bool relayout_compatible_v = std::is_same_v<typename Out::value_type, typename X::value_type> &&
                                       std::is_same_v<typename Out::execution_space, typename X::execution_space> &&
                                       std::is_same_v<typename Out::mesh_type, typename X::mesh_type> &&
                                       std::is_same_v<typename Out::dims, typename X::dims>;

// The gradient rule of relayout and rename: the result's gradient relayouted back. A gradient that
// is still a sum of partials over axes (the tape's pending_axes; autodiff/tape.hpp asks rules for
// `partial`) need not be reduced first where the way back is local and slices nothing over those
// axes (each addend moves alike: the sum of the slices is the slice of the sum), so it goes on as a
// partial sum; where the way back splits dims over exactly those axes, one reduce_scatter does the
// allreduce and the slicing (the backward of sequence parallelism's allgather).
template <Tensor Out, Tensor X>
struct relayout_rule {
  X x;
  void operator()(const Out& g) const { push_grad(x, relayout_kernel<X>(g, "relayout (gradient)")); }
  bool partial(const Out& g, axis_set axes) const {
    constexpr auto back = analyze_relayout<X::rank>(Out::splits, X::splits);
    if constexpr (back.kind == relayout_kind::share || back.kind == relayout_kind::local) {
      if ((added_axes<X::rank>(Out::splits, X::splits) & axes) == 0) {
        X moved = relayout_kernel<X>(g, "relayout (gradient)");
        if (moved.view().data() == g.view().data()) moved = clone(moved);  // the tape adds into what it is given
        push_partial_grad(x, std::move(moved), axes);
        return true;
      }
    }
    if (!scatters_over<X::rank>(Out::splits, X::splits, axes)) return false;
    if (start_sum_behind_pass(x, g, axes)) return true;
    push_fresh_grad(x, reduce_scatter_kernel<X>(g, axes));
    return true;
  }
};

}  // namespace detail

// The collectives relayout<Out>(x) runs, for x of type X (dim by dim in position order).
template <Tensor Out, Tensor X>
constexpr comm_plan relayout_plan() {
  return detail::plan_of(analyze_relayout<X::rank>(X::splits, Out::splits));
}

// Gradient: the result's gradient relayouted back to x's layout.
template <Tensor Out, Tensor X>
Out relayout(const X& x) {
  if constexpr (!detail::relayout_compatible_v<Out, X>) {
    (void)sizeof(diagnostic::relayout_changes_more_than_layout<Out, X>);
    return Out{};
  } else {
    const detail::op_call call(detail::planned_op{"relayout", relayout_plan<Out, X>()}, x);
    Out out = detail::relayout_kernel<Out>(x, "relayout");
    detail::record<Out>(out, detail::relayout_rule<Out, X>{detail::node_only(x)}, x);
    return out;
  }
}

}  // namespace meshtensor
