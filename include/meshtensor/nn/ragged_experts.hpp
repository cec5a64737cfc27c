#pragma once
// Dropless routed experts by a ragged dispatch (routed_moe's moe_dispatch::ragged): every
// (token, choice) row goes to the processor that holds its expert, sorted by expert, in one
// alltoallv; each expert's rows meet its SwiGLU weights in one product per weight (a grouped
// product); the results come back by the reverse alltoallv to their (token, choice) places. No slot
// that no token took is computed, and no [tokens, experts, capacity] tensor exists.
//
//   out = ragged_experts<Dims>(x, chosen, w_gate, w_up, w_down)   // [G, S, K, M]: expert chosen[g, s, k] of x[g, s]
//
// How many rows a processor sends and receives is data: the router decides it. So the tensors keep
// their types at the edges (x [G, S, M] in, [G, S, K, M] out, split as x) and the ragged buffers
// between them are this op's, not tensors. The experts are exchanged over Experts' axes, which
// must be among Group's: a processor's tokens go to the processors that differ from it on those
// axes only. DFf may be split over axes the groups are not (expert tensor parallelism: each
// processor of those axes holds a slice of every expert's width and receives the same rows): the
// down products' and x's gradient's partial sums are then allreduced over them. A plan counts the
// three alltoalls (the counts, the rows out, the rows back) and, the routing unknown, an even share
// of rows for every expert: a run's bytes, products and memory differ from the plan's by the
// router's imbalance; its calls do not.
//
// In n chunks (routed_moe's overlap_chunks): each processor's experts cut into n ranges, each
// chunk's rows out and back a nonblocking alltoallv of its own (the counts still one), chunk c + 1's
// rows out and chunk c - 1's rows back in flight while chunk c's experts compute (an MPI_Test
// between the products), forward and backward alike. Chunks of experts rather than of rows: each
// expert's rows stay one product, so the results are the unchunked ones exactly, and a chunk's
// exchange is the unchunked one's blocks for fewer experts.
//
// Gradient: through x and the three weights (chosen is off the tape), two alltoalls per chunk (the
// rows' gradients to the experts, x's back). Where Group is split over axes that Experts is not, the
// weights' gradients are partial sums over those axes (data parallelism), reduced by the tape.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "../error.hpp"
#include "../kernels/launch.hpp"
#include "../kernels/pool.hpp"
#include "../kernels/product.hpp"
#include "../ops/elementwise.hpp"
#include "../runtime/collectives.hpp"
#include "../ops/op_call.hpp"
#include "../tensor/allreduce_slice.hpp"
#include "../tensor/mpi_buffer.hpp"
#include "moe.hpp"

namespace meshtensor::detail {

// Where this processor's (token, choice) rows go, what it receives, and how its experts' rows lie,
// chunk by chunk: chunk c holds the rows bound for chunk c of every peer's experts (a peer of L
// experts: its experts c L / n to (c + 1) L / n - 1), each chunk a ragged dispatch of its own.
// Host tables, the same shape in a plan (where the routing is unknown: an even share).
struct ragged_chunk {
  std::int64_t first_expert = 0, experts = 0;  // this processor's experts in the chunk (local indices)
  std::int64_t pairs = 0, received = 0;        // rows sent, rows received
  std::int64_t sent_from = 0;                  // its first row among all chunks' sent rows
  std::int64_t grouped_from = 0;               // its first row among all chunks' grouped rows
  std::vector<std::int64_t> order;             // send position -> pair (token * k + choice), sorted by (peer, expert)
  std::vector<int> send_rows, recv_rows;       // per peer
  std::vector<std::int64_t> grouped_at;        // receive position -> position among the chunk's grouped rows
  std::vector<std::int64_t> received_at;       // and back
};

struct ragged_routes {
  std::int64_t local_experts = 0;  // this processor's
  std::int64_t pairs = 0, received = 0;
  std::vector<std::int64_t> expert_rows;  // per local expert, from every peer: grouped expert by expert
  std::vector<std::int64_t> place;        // pair -> its position among all chunks' sent rows
  std::vector<ragged_chunk> chunks;
};

// The routing of `pairs` rows whose experts are chosen[pair] (null in a plan), in `chunks` chunks,
// with the counts exchanged over `axes` (one alltoall of ints). A plan sends every expert an even
// share of each peer's rows (peer_pairs: each peer's count), so that what the peers receive sums
// to what they send. first_expert, experts_of: each peer's range of experts (sub-rank order); me:
// this processor's peer.
template <class Comm>
ragged_routes route_rows(Comm& comm, axis_set axes, int me, const std::vector<std::int64_t>& first_expert,
                         const std::vector<std::int64_t>& experts_of, std::int64_t experts, const std::int64_t* chosen,
                         std::int64_t pairs, const std::vector<std::int64_t>& peer_pairs, std::int64_t chunks = 1) {
  ragged_routes r;
  const int peers = static_cast<int>(first_expert.size());
  r.local_experts = experts_of[static_cast<std::size_t>(me)];
  r.pairs = pairs;
  const std::int64_t widest = *std::max_element(experts_of.begin(), experts_of.end());
  const auto bound = [&](int q, std::int64_t c) { return c * experts_of[static_cast<std::size_t>(q)] / chunks; };
  // Rows per expert here, sorted by (chunk, peer, expert) then pair: a counting sort.
  const auto even_share = [&](std::int64_t of, std::int64_t e) { return of / experts + (e < of % experts ? 1 : 0); };
  std::vector<std::int64_t> per_expert(static_cast<std::size_t>(experts), 0);
  const bool planned = chosen == nullptr;
  if (!planned)  // top_k's indices over the experts: in range by construction
    for (std::int64_t i = 0; i < pairs; ++i) ++per_expert[static_cast<std::size_t>(chosen[i])];
  else
    for (std::int64_t e = 0; e < experts; ++e) per_expert[static_cast<std::size_t>(e)] = even_share(pairs, e);
  std::vector<std::int64_t> start(static_cast<std::size_t>(experts), 0), chunk_of(static_cast<std::size_t>(experts), 0);
  std::vector<int> counts_to(static_cast<std::size_t>(peers * widest), 0);
  r.chunks.resize(static_cast<std::size_t>(chunks));
  for (std::int64_t c = 0; c < chunks; ++c) {
    auto& ch = r.chunks[static_cast<std::size_t>(c)];
    ch.send_rows.assign(static_cast<std::size_t>(peers), 0);
    for (int q = 0; q < peers; ++q)
      for (std::int64_t j = bound(q, c); j < bound(q, c + 1); ++j) {
        const auto e = static_cast<std::size_t>(first_expert[static_cast<std::size_t>(q)] + j);
        chunk_of[e] = c;
        start[e] = ch.pairs;
        ch.pairs += per_expert[e];
        ch.send_rows[static_cast<std::size_t>(q)] += static_cast<int>(per_expert[e]);
        counts_to[static_cast<std::size_t>(q * widest + j)] = static_cast<int>(per_expert[e]);
      }
    ch.order.assign(static_cast<std::size_t>(ch.pairs), 0);
    if (c + 1 < chunks) r.chunks[static_cast<std::size_t>(c + 1)].sent_from = ch.sent_from + ch.pairs;
  }
  r.place.assign(static_cast<std::size_t>(pairs), 0);
  for (std::int64_t i = 0; i < pairs; ++i) {
    const auto e = static_cast<std::size_t>(planned ? i % experts : chosen[i]);
    auto& ch = r.chunks[static_cast<std::size_t>(chunk_of[e])];
    r.place[static_cast<std::size_t>(i)] = ch.sent_from + start[e];
    ch.order[static_cast<std::size_t>(start[e]++)] = i;
  }

  // What every peer sends this processor's experts; in a plan, as many as it sends itself.
  std::vector<int> counts_from(counts_to.size(), 0);
  if (!axes.empty()) alltoall(comm, axes, counts_to.data(), widest, counts_from.data());
  else counts_from = counts_to;
  if (planned)
    for (int s = 0; s < peers; ++s)
      for (std::int64_t j = 0; j < r.local_experts; ++j)
        counts_from[static_cast<std::size_t>(s * widest + j)] =
            static_cast<int>(even_share(peer_pairs[static_cast<std::size_t>(s)], first_expert[me] + j));
  r.expert_rows.assign(static_cast<std::size_t>(r.local_experts), 0);
  for (int s = 0; s < peers; ++s)
    for (std::int64_t j = 0; j < r.local_experts; ++j)
      r.expert_rows[static_cast<std::size_t>(j)] += counts_from[static_cast<std::size_t>(s * widest + j)];
  // A chunk's rows received: peer by peer, each peer's rows by expert. Grouped: expert by expert,
  // peer by peer, the chunks one after the other (so all of them are expert by expert too).
  for (std::int64_t c = 0; c < chunks; ++c) {
    auto& ch = r.chunks[static_cast<std::size_t>(c)];
    ch.first_expert = bound(me, c);
    ch.experts = bound(me, c + 1) - ch.first_expert;
    ch.grouped_from = r.received;
    ch.recv_rows.assign(static_cast<std::size_t>(peers), 0);
    std::vector<std::int64_t> next(static_cast<std::size_t>(ch.experts), 0);
    for (std::int64_t j = 1; j < ch.experts; ++j)
      next[static_cast<std::size_t>(j)] = next[static_cast<std::size_t>(j - 1)] +
                                          r.expert_rows[static_cast<std::size_t>(ch.first_expert + j - 1)];
    for (int s = 0; s < peers; ++s)
      for (std::int64_t j = 0; j < ch.experts; ++j)
        ch.recv_rows[static_cast<std::size_t>(s)] += counts_from[static_cast<std::size_t>(s * widest + ch.first_expert + j)];
    for (const int n : ch.recv_rows) ch.received += n;
    ch.grouped_at.assign(static_cast<std::size_t>(ch.received), 0);
    ch.received_at.assign(static_cast<std::size_t>(ch.received), 0);
    std::int64_t pos = 0;
    for (int s = 0; s < peers; ++s)
      for (std::int64_t j = 0; j < ch.experts; ++j)
        for (int n = 0; n < counts_from[static_cast<std::size_t>(s * widest + ch.first_expert + j)]; ++n, ++pos) {
          auto& at = next[static_cast<std::size_t>(j)];
          ch.grouped_at[static_cast<std::size_t>(pos)] = at;
          ch.received_at[static_cast<std::size_t>(at++)] = pos;
        }
    r.received += ch.received;
  }
  return r;
}

template <class Exec>
using index_view = Kokkos::View<std::int64_t*, typename Exec::memory_space>;

template <class Exec>
index_view<Exec> index_table(const std::vector<std::int64_t>& host) {
  const auto t = host_table<std::int64_t>(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) t(i) = host[i];
  return kernels::copy_to(typename Exec::memory_space{}, t);
}

template <class Exec, class T>
Kokkos::View<T*, typename Exec::memory_space> rows_buffer(std::int64_t rows, std::int64_t width) {
  return view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(rows * width));
}

// dst's row i = src's row at(i) / per (per = k: a pair's token); with sum = k > 0, the sum of
// src's rows at(i k) ... at(i k + k - 1) (x's gradient: a token's k choices). Rows of `width`.
template <class Exec, class V>
void gather_rows(const V& dst, const V& src, const index_view<Exec>& at, std::int64_t rows, std::int64_t width,
                 std::int64_t per = 1, std::int64_t sum = 0) {
  using T = typename V::value_type;
  if (sum == 0) {
    kernels::parallel_for(
        "meshtensor::ragged_rows", kernels::range<Exec>(0, rows * width), KOKKOS_LAMBDA(std::int64_t i) {
          const std::int64_t r = i / width, c = i % width;
          dst(i) = src(at(r) / per * width + c);
        });
  } else {
    kernels::parallel_for(
        "meshtensor::ragged_rows_sum", kernels::range<Exec>(0, rows * width), KOKKOS_LAMBDA(std::int64_t i) {
          const std::int64_t r = i / width, c = i % width;
          compute_t<T> acc = 0;
          for (std::int64_t k = 0; k < sum; ++k) acc += compute_t<T>(src(at(r * sum + k) * width + c));
          dst(i) = T(acc);
        });
  }
}

// A range of a flat view, as the products take it.
template <class V>
V part(const V& v, std::int64_t first, std::int64_t n) {
  return V(Kokkos::subview(v, std::make_pair(first, first + n)));
}

// Rows to the peers over axes (send_rows each) and from them (recv_rows each), received by wait()
// into `into` (a buffer of its own where that is empty). Started (a nonblocking alltoallv, moved on
// by progress()) where other work is to run meanwhile, else run whole when made. Where axes is
// empty nothing moves: the rows received are send's (copied into `into` unless it is send).
template <class Exec, class T>
class rows_in_flight {
  using V = Kokkos::View<T*, typename Exec::memory_space>;
  using buffers = mpi_buffer<Exec, T>;

 public:
  rows_in_flight(communicator& comm, axis_set axes, const V& send, const std::vector<int>& send_rows,
                 const std::vector<int>& recv_rows, std::int64_t width, bool started, V into)
      : comm_(&comm), axes_(axes), received_(std::move(into)) {
    if (axes.empty()) {
      if (received_.data() == nullptr) received_ = send;
      else if (received_.data() != send.data() && !planning()) kernels::deep_copy(received_, send);
      return;
    }
    sent_ = counted(send_rows, width, send_counts_, send_displs_);
    const std::int64_t total = counted(recv_rows, width, recv_counts_, recv_displs_);
    if (received_.data() == nullptr)
      received_ = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(total));
    out_.emplace(buffers::reading(send));
    in_.emplace(buffers::receiving_into(received_));
    if (started) {
      started_ = start_alltoallv(comm, axes, false, out_->data(), send_counts_, send_displs_, in_->data(), recv_counts_,
                                 recv_displs_);
    } else {
      alltoallv(comm, axes, false, out_->data(), send_counts_, send_displs_, in_->data(), recv_counts_, recv_displs_);
      land();
    }
  }
  rows_in_flight(const rows_in_flight&) = delete;
  rows_in_flight& operator=(const rows_in_flight&) = delete;
  // Only reached unfinished when an error left the caller early: MPI still reads and writes the buffers.
  ~rows_in_flight() {
    if (started_.request != MPI_REQUEST_NULL) MPI_Wait(&started_.request, MPI_STATUS_IGNORE);
  }

  // One MPI_Test (Open MPI moves a nonblocking collective on only inside MPI calls).
  void progress() {
    int done = 0;
    if (started_.request != MPI_REQUEST_NULL) MPI_Test(&started_.request, &done, MPI_STATUS_IGNORE);
  }
  V wait() {
    if (in_) {
      comm_->await_started(started_, collective::alltoall, axes_, sent_ * static_cast<std::int64_t>(sizeof(T)));
      land();
    }
    return received_;
  }

 private:
  communicator* comm_;
  axis_set axes_;
  std::int64_t sent_ = 0;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;  // MPI reads them until it is done
  V received_;
  std::optional<buffers> out_, in_;
  started_collective started_;

  static std::int64_t counted(const std::vector<int>& rows, std::int64_t width, std::vector<int>& counts,
                              std::vector<int>& displs) {
    std::int64_t total = 0;
    for (const int n : rows) {
      counts.push_back(checked_count(n * width));
      displs.push_back(checked_count(total));
      total += n * width;
    }
    return total;
  }
  void land() {
    in_->copy_into(received_);
    in_.reset();
    out_.reset();
  }
};

// The SwiGLU experts' weights of this processor as flat views: [experts, M, F] twice, [experts, F, M].
template <class Exec, class T>
struct expert_weights {
  Kokkos::View<T*, typename Exec::memory_space> gate, up, down;
  std::int64_t d_model, d_ff;  // d_ff: this processor's slice of an expert's width
  axis_set width_axes;         // DFf's: the products over it are partial sums there
};

// What the backward pass reads: the routes, the experts' rows and their products' inputs.
template <class Exec, class T>
struct ragged_saved {
  ragged_routes routes;
  index_view<Exec> place;
  std::vector<index_view<Exec>> order, grouped_at, received_at;  // each chunk's
  temporary_view<T, typename Exec::memory_space> rows, gate, up;  // grouped: [received, M], [received, F] twice
  ragged_saved(ragged_routes r, std::int64_t d_model, std::int64_t d_ff)
      : routes(std::move(r)),
        place(index_table<Exec>(routes.place)),
        rows(static_cast<std::size_t>(routes.received * d_model)),
        gate(static_cast<std::size_t>(routes.received * d_ff)),
        up(static_cast<std::size_t>(routes.received * d_ff)) {
    for (const auto& ch : routes.chunks) {
      order.push_back(index_table<Exec>(ch.order));
      grouped_at.push_back(index_table<Exec>(ch.grouped_at));
      received_at.push_back(index_table<Exec>(ch.received_at));
    }
  }
};

// Each chunk's exchange out (rows to the experts: send(c)), its work on the rows received
// (work(c, received, back, progress) writes the rows to send back into back, grouped, calling
// progress between its products), and its exchange back into rows_back (all chunks' sent rows),
// with chunk c + 1's exchange out and chunk c - 1's back in flight while chunk c works. With one
// chunk every exchange runs whole. With more, how many rows each exchange carries is the router's,
// counted as routed bytes (the rows back, and what work reduces, always are).
template <class Exec, class T, class Send, class Work>
void ragged_chunks(communicator& comm, axis_set axes, const ragged_routes& r, std::int64_t width, Send send, Work work,
                   const Kokkos::View<T*, typename Exec::memory_space>& rows_back) {
  using moving = std::unique_ptr<rows_in_flight<Exec, T>>;
  using V = Kokkos::View<T*, typename Exec::memory_space>;
  const std::size_t n = r.chunks.size();
  const bool started = n > 1;
  const auto out = [&](std::size_t c) {
    std::optional<routed_bytes> routed;
    if (started) routed.emplace(comm);
    const auto& ch = r.chunks[c];
    return std::make_unique<rows_in_flight<Exec, T>>(comm, axes, send(c), ch.send_rows, ch.recv_rows, width, started, V());
  };
  moving here = out(0), next, back;
  for (std::size_t c = 0; c < n; ++c) {
    if (c + 1 < n) next = out(c + 1);
    const auto progress = [&] {
      if (next) next->progress();
      if (back) back->progress();
    };
    const auto& ch = r.chunks[c];
    const V landing = part(rows_back, ch.sent_from * width, ch.pairs * width);
    // Over no axes the rows back are written where they land.
    const V back_rows = axes.empty() ? landing : rows_buffer<Exec, T>(ch.received, width);
    const routed_bytes routed(comm);
    work(c, here->wait(), back_rows, progress);
    here.reset();
    if (back) back->wait();
    back = std::make_unique<rows_in_flight<Exec, T>>(comm, axes, back_rows, ch.recv_rows, ch.send_rows, width, started,
                                                     landing);
    here = std::move(next);
  }
  back->wait();
}

// The element kernels of a chunk's rows [first, last) of flat views (free functions: CUDA allows no
// device lambda inside the generic lambdas that run a chunk). h = silu(g) u:
template <class Exec, class V>
void swiglu_elements(const V& h, const V& g, const V& u, std::int64_t first, std::int64_t last) {
  using T = typename V::value_type;
  kernels::parallel_for(
      "meshtensor::ragged_swiglu", kernels::range<Exec>(first, last),
      KOKKOS_LAMBDA(std::int64_t i) { h(i) = T(fn::silu_fn::f(compute_t<T>(g(i))) * compute_t<T>(u(i))); });
}
// From dh, h's gradient: dh becomes the gate's gradient, h the up projection's (h is read no more).
template <class Exec, class V>
void swiglu_gradient_elements(const V& h, const V& dh, const V& g, const V& u, std::int64_t first, std::int64_t last) {
  using T = typename V::value_type;
  kernels::parallel_for(
      "meshtensor::ragged_swiglu_grad", kernels::range<Exec>(first, last), KOKKOS_LAMBDA(std::int64_t i) {
        const compute_t<T> gi = g(i), ui = u(i), dhi = dh(i), si = fn::silu_fn::f(gi);
        h(i) = T(dhi * si);
        dh(i) = T(dhi * ui * fn::silu_fn::df(gi, si));
      });
}
// a += b
template <class Exec, class V>
void add_elements(const V& a, const V& b, std::int64_t first, std::int64_t last) {
  using T = typename V::value_type;
  kernels::parallel_for(
      "meshtensor::ragged_rows_add", kernels::range<Exec>(first, last),
      KOKKOS_LAMBDA(std::int64_t i) { a(i) = T(compute_t<T>(a(i)) + compute_t<T>(b(i))); });
}

// Forward: x's rows (tokens x M, token-major) through their chosen experts, to out (pairs x M).
template <class Exec, class T>
Kokkos::View<T*, typename Exec::memory_space> ragged_forward(communicator& comm, axis_set axes,
                                                             const ragged_saved<Exec, T>& s,
                                                             const Kokkos::View<T*, typename Exec::memory_space>& x,
                                                             const expert_weights<Exec, T>& w, std::int64_t k) {
  using V = Kokkos::View<T*, typename Exec::memory_space>;
  using Tmp = temporary_view<T, typename Exec::memory_space>;
  const auto& r = s.routes;
  const std::int64_t m = w.d_model, f = w.d_ff;
  const Tmp hidden(static_cast<std::size_t>(r.received * f)), done(static_cast<std::size_t>(r.received * m));
  const auto send = [&](std::size_t c) {
    const V rows = rows_buffer<Exec, T>(r.chunks[c].pairs, m);
    gather_rows<Exec>(rows, x, s.order[c], r.chunks[c].pairs, m, k);
    return rows;
  };
  const auto work = [&](std::size_t c, const V& received, const V& back, const auto& progress) {
    const auto& ch = r.chunks[c];
    const std::int64_t from = ch.grouped_from, rows = ch.received;
    gather_rows<Exec>(part(s.rows.v, from * m, rows * m), received, s.received_at[c], rows, m);
    std::int64_t first = from;
    for (std::int64_t j = ch.first_expert; j < ch.first_expert + ch.experts; ++j) {
      const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
      kernels::product<Exec, T>(1, n, f, m, false, false, part(s.rows.v, first * m, n * m),
                                part(w.gate, j * m * f, m * f), part(s.gate.v, first * f, n * f));
      progress();
      kernels::product<Exec, T>(1, n, f, m, false, false, part(s.rows.v, first * m, n * m), part(w.up, j * m * f, m * f),
                                part(s.up.v, first * f, n * f));
      progress();
      first += n;
    }
    const V h = hidden.v;
    swiglu_elements<Exec>(h, s.gate.v, s.up.v, from * f, (from + rows) * f);
    first = from;
    for (std::int64_t j = ch.first_expert; j < ch.first_expert + ch.experts; ++j) {
      const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
      kernels::product<Exec, T>(1, n, m, f, false, false, part(h, first * f, n * f), part(w.down, j * f * m, f * m),
                                part(done.v, first * m, n * m));
      progress();
      first += n;
    }
    const V done_here = part(done.v, from * m, rows * m);
    allreduce_slice<Exec, T>(comm, done_here, w.width_axes, reduce_op::sum);
    gather_rows<Exec>(back, done_here, s.grouped_at[c], rows, m);
  };
  const V back = rows_buffer<Exec, T>(r.pairs, m);
  ragged_chunks<Exec, T>(comm, axes, r, m, send, work, back);
  const V out = rows_buffer<Exec, T>(r.pairs, m);
  gather_rows<Exec>(out, back, s.place, r.pairs, m);
  return out;
}

template <class Exec, class T>
struct ragged_gradients {
  Kokkos::View<T*, typename Exec::memory_space> x, gate, up, down;
};

// Backward: out's gradient (pairs x M) to x's (tokens x M) and the weights', chunk by chunk as forward.
template <class Exec, class T>
ragged_gradients<Exec, T> ragged_backward(communicator& comm, axis_set axes, const ragged_saved<Exec, T>& s,
                                          const Kokkos::View<T*, typename Exec::memory_space>& d_out,
                                          const expert_weights<Exec, T>& w, std::int64_t tokens, std::int64_t k) {
  using V = Kokkos::View<T*, typename Exec::memory_space>;
  using Tmp = temporary_view<T, typename Exec::memory_space>;
  const auto& r = s.routes;
  const std::int64_t m = w.d_model, f = w.d_ff, e_here = r.local_experts;
  const Tmp d_done(static_cast<std::size_t>(r.received * m)), hidden(static_cast<std::size_t>(r.received * f)),
      d_hidden(static_cast<std::size_t>(r.received * f)), d_rows(static_cast<std::size_t>(r.received * m)),
      d_rows_up(static_cast<std::size_t>(r.received * m));
  ragged_gradients<Exec, T> d{V(), rows_buffer<Exec, T>(e_here, m * f), rows_buffer<Exec, T>(e_here, m * f),
                              rows_buffer<Exec, T>(e_here, f * m)};
  const auto send = [&](std::size_t c) {
    const V rows = rows_buffer<Exec, T>(r.chunks[c].pairs, m);
    gather_rows<Exec>(rows, d_out, s.order[c], r.chunks[c].pairs, m);
    return rows;
  };
  const auto work = [&](std::size_t c, const V& received, const V& back, const auto& progress) {
    const auto& ch = r.chunks[c];
    const std::int64_t from = ch.grouped_from, rows = ch.received, last = ch.first_expert + ch.experts;
    gather_rows<Exec>(part(d_done.v, from * m, rows * m), received, s.received_at[c], rows, m);
    const V h = hidden.v, dh = d_hidden.v;
    swiglu_elements<Exec>(h, s.gate.v, s.up.v, from * f, (from + rows) * f);
    std::int64_t first = from;
    for (std::int64_t j = ch.first_expert; j < last; ++j) {
      const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
      if (n == 0) {  // an expert no token chose: its weights' gradients are zero (no product over 0 rows)
        kernels::deep_copy(part(d.gate, j * m * f, m * f), T(0));
        kernels::deep_copy(part(d.up, j * m * f, m * f), T(0));
        kernels::deep_copy(part(d.down, j * f * m, f * m), T(0));
        continue;
      }
      kernels::product<Exec, T>(1, n, f, m, false, true, part(d_done.v, first * m, n * m),
                                part(w.down, j * f * m, f * m), part(dh, first * f, n * f));
      progress();
      kernels::product<Exec, T>(1, f, m, n, true, false, part(h, first * f, n * f), part(d_done.v, first * m, n * m),
                                part(d.down, j * f * m, f * m));
      progress();
      first += n;
    }
    swiglu_gradient_elements<Exec>(h, dh, s.gate.v, s.up.v, from * f, (from + rows) * f);
    first = from;
    for (std::int64_t j = ch.first_expert; j < last; ++j) {
      const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
      if (n == 0) continue;
      const V rows_j = part(s.rows.v, first * m, n * m), dg_j = part(dh, first * f, n * f),
              du_j = part(h, first * f, n * f);
      kernels::product<Exec, T>(1, m, f, n, true, false, rows_j, dg_j, part(d.gate, j * m * f, m * f));
      kernels::product<Exec, T>(1, m, f, n, true, false, rows_j, du_j, part(d.up, j * m * f, m * f));
      progress();
      kernels::product<Exec, T>(1, n, m, f, false, true, dg_j, part(w.gate, j * m * f, m * f),
                                part(d_rows.v, first * m, n * m));
      kernels::product<Exec, T>(1, n, m, f, false, true, du_j, part(w.up, j * m * f, m * f),
                                part(d_rows_up.v, first * m, n * m));
      progress();
      first += n;
    }
    const V a = d_rows.v;
    add_elements<Exec>(a, d_rows_up.v, from * m, (from + rows) * m);
    const V d_rows_here = part(a, from * m, rows * m);
    allreduce_slice<Exec, T>(comm, d_rows_here, w.width_axes, reduce_op::sum);
    gather_rows<Exec>(back, d_rows_here, s.grouped_at[c], rows, m);
  };
  const V back = rows_buffer<Exec, T>(r.pairs, m);
  ragged_chunks<Exec, T>(comm, axes, r, m, send, work, back);
  d.x = rows_buffer<Exec, T>(tokens, m);
  gather_rows<Exec>(d.x, back, s.place, tokens, m, 1, k);
  return d;
}

}  // namespace meshtensor::detail

namespace meshtensor::detail {

// The collectives ragged_experts runs forward in `chunks` chunks: the counts, then each chunk's
// rows out and rows back, each one alltoall over Experts' axes (none where Experts is not split);
// where DFf is split, an allreduce of each chunk's results over its axes.
template <class Dims, Tensor X>
constexpr comm_plan ragged_experts_plan(std::int64_t chunks = 1) {
  using W = moe_t<X, typename Dims::experts, typename Dims::d_model, typename Dims::d_ff>;
  return comm_plan{}
      .then(collective::alltoall, W::layout_type::template split_of<typename Dims::experts>().mask(), 1 + 2 * chunks)
      .then(collective::allreduce, W::layout_type::template split_of<typename Dims::d_ff>().mask(), chunks);
}

// x[G, S, M] through the experts chosen[G, S, K] picks (ints, off the tape): [G, S, K, M], split as
// x; with chunks > 1, each processor's experts in that many chunks, each chunk's rows exchanged
// while the chunk before computes (at most as many chunks as the fewest experts a processor holds). The operands in these dims' orders (routed_moe transposes them); the layout's fit is checked
// here, at run time and alike on every processor (from the layout and the mesh's sizes), so that
// routed_moe compiles for every layout and refuses the ragged dispatch by name where it cannot run.
template <class Dims, Tensor X, Tensor I, Tensor WI, Tensor WO>
auto ragged_experts(const X& x, const I& chosen, const WI& w_gate, const WI& w_up, const WO& w_down,
                    std::int64_t chunks = 1) {
  using G = typename Dims::group;
  using S = typename Dims::token;
  using M = typename Dims::d_model;
  using F = typename Dims::d_ff;
  using E = typename Dims::experts;
  using K = nn::expert_choice;
  using T = typename X::value_type;
  using Exec = typename X::execution_space;
  using Out = moe_t<X, G, S, K, M>;
  static_assert(std::is_same_v<typename X::dims, type_list<G, S, M>> && std::is_same_v<typename I::dims, type_list<G, S, K>> &&
                std::is_same_v<typename WI::dims, type_list<E, M, F>> && std::is_same_v<typename WO::dims, type_list<E, F, M>>);
  constexpr axis_set group_axes = X::layout_type::template split_of<G>().mask();
  constexpr axis_set expert_axes = WI::layout_type::template split_of<E>().mask();
  // Whole rows of M on every processor, and DFf split (if at all) over axes the groups are not, so
  // that the processors sharing an expert's width hold the same tokens.
  auto& comm = x.mesh().communicator();
  constexpr axis_set model_axes = X::layout_type::template split_of<M>().mask() | WI::layout_type::template split_of<M>().mask() |
                                  WO::layout_type::template split_of<M>().mask();
  constexpr axis_set width_axes = WI::layout_type::template split_of<F>().mask();
  static_assert(WO::layout_type::template split_of<F>().mask() == width_axes,
                "meshtensor::nn::routed_moe: w_down's d_ff must be split as w_gate's and w_up's");
  if ((expert_axes.bits & ~group_axes.bits) != 0 || (width_axes.bits & group_axes.bits) != 0 ||
      comm.size_over(model_axes) != 1)
    throw layout_error(cat("routed_moe: the ragged dispatch sends a token to the processors that differ from its own only on ",
                           "the axes of dim '", E::name(), "', whole rows of '", M::name(), "': it needs '", E::name(),
                           "' split over axes that split '", G::name(), "' (here ", comm.axes_string(expert_axes), " and ",
                           comm.axes_string(group_axes), "), '", M::name(), "' not split (here over ",
                           comm.axes_string(model_axes), "), and '", F::name(), "' split over none of '", G::name(),
                           "''s axes (here over ", comm.axes_string(width_axes), "); the one-hot dispatch takes any layout"));
  const op_call call(planned_op{"ragged_experts", ragged_experts_plan<Dims, X>(chunks)}, x);
  const std::int64_t tokens = x.template local_extent<G>() * x.template extent<S>(), k = chosen.template extent<K>();
  const std::int64_t m = x.template extent<M>(), f = w_gate.template local_extent<F>(), experts = w_gate.template extent<E>();

  // Which experts each peer over Experts' axes holds (sub-rank order), and which peer this is.
  const int peers = comm.size_over(expert_axes);
  std::vector<std::int64_t> first(static_cast<std::size_t>(peers)), held(static_cast<std::size_t>(peers)),
      peer_pairs(static_cast<std::size_t>(peers));
  int me = 0;
  const auto experts_at = w_gate.placement();
  const auto tokens_at = x.placement();
  for (int q = 0; q < peers; ++q) {
    const auto at = comm.shape().peer_coords(comm.coords(), expert_axes, q);
    const auto b = experts_at.box_at(at);
    first[static_cast<std::size_t>(q)] = b.offset[0];
    held[static_cast<std::size_t>(q)] = b.extent[0];
    peer_pairs[static_cast<std::size_t>(q)] = tokens_at.box_at(at).extent[0] * x.template extent<S>() * k;
    if (at == comm.coords()) me = q;
  }
  // From the placements alone: every processor refuses alike.
  const std::int64_t fewest = *std::min_element(held.begin(), held.end());
  if (chunks < 1 || (chunks > 1 && chunks > fewest))
    throw shape_error(cat("routed_moe: overlap_chunks = ", chunks, " cuts each processor's experts into chunks, but ",
                          "a processor holds ", fewest, " of the ", experts, " experts (dim '", E::name(),
                          "' split over ", comm.axes_string(expert_axes), "); give 1 (no overlap) to ", fewest));
  kernels::fence(Exec{});  // the router's choice is read on the host
  std::vector<std::int64_t> choices;
  if (!comm.planned()) {
    const auto h = kernels::copy_to(Kokkos::HostSpace{}, chosen.view());
    choices.assign(h.data(), h.data() + tokens * k);
  }
  auto saved = std::make_shared<ragged_saved<Exec, T>>(
      route_rows(comm, expert_axes, me, first, held, experts,
                 comm.planned() ? nullptr : choices.data(), tokens * k, peer_pairs, chunks),
      m, f);
  const expert_weights<Exec, T> weights{w_gate.view(), w_up.view(), w_down.view(), m, f, width_axes};
  Out out(x.mesh(), {x.template extent<G>(), x.template extent<S>(), k, m},
          ragged_forward<Exec, T>(comm, expert_axes, *saved, x.view(), weights, k));
  record<Out>(
      out,
      [x = node_only(x), w_gate, w_up, w_down, saved, tokens, k](const Out& g) {
        const expert_weights<Exec, T> w{w_gate.view(), w_up.view(), w_down.view(), g.template extent<M>(),
                                        w_gate.template local_extent<F>(), WI::layout_type::template split_of<F>().mask()};
        constexpr axis_set over = WI::layout_type::template split_of<E>().mask();
        constexpr axis_set partial = X::layout_type::template split_of<G>().mask() & ~over.bits;
        auto d = ragged_backward<Exec, T>(g.mesh().communicator(), over, *saved, g.view(), w, tokens, k);
        push_fresh_grad(x, X(x.mesh(), x.extents(), d.x));
        // A branch at run time: nvcc takes no constexpr local in a generic lambda's if constexpr.
        const auto push = [&](const auto& weight, auto&& grad) {
          if (partial.empty()) push_fresh_grad(weight, std::move(grad));
          else push_partial_grad(weight, std::move(grad), partial);
        };
        push(w_gate, WI(w_gate.mesh(), w_gate.extents(), d.gate));
        push(w_up, WI(w_up.mesh(), w_up.extents(), d.up));
        push(w_down, WO(w_down.mesh(), w_down.extents(), d.down));
      },
      x, w_gate, w_up, w_down);
  return out;
}

}  // namespace meshtensor::detail
