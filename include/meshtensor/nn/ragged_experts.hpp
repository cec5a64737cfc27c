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
// down products' and x's gradient's partial sums are then allreduced over them. A plan counts the three alltoalls (the counts, the rows out, the rows back) and, the
// routing unknown, an even share of rows for every expert: a run's bytes, products and memory
// differ from the plan's by the router's imbalance; its calls do not.
//
// Gradient: through x and the three weights (chosen is off the tape), two alltoalls (the rows'
// gradients to the experts, x's back). Where Group is split over axes that Experts is not, the
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

// Where this processor's (token, choice) rows go, what it receives, and how its experts' rows lie.
// Host tables, the same shape in a plan (where the routing is unknown: an even share).
struct ragged_routes {
  std::int64_t local_experts = 0;  // this processor's
  std::int64_t pairs = 0, received = 0;
  std::vector<std::int64_t> order;        // send position -> pair (token * k + choice), sorted by (peer, expert)
  std::vector<std::int64_t> place;        // pair -> send position
  std::vector<int> send_rows, recv_rows;  // per peer
  std::vector<std::int64_t> expert_rows;  // per local expert, from every peer
  std::vector<std::int64_t> grouped_at;   // receive position -> position among the experts' rows
  std::vector<std::int64_t> received_at;  // and back
};

// The routing of `pairs` rows whose experts are chosen[pair] (null in a plan), with the counts
// exchanged over `axes` (one alltoall of ints). A plan sends every expert an even share of each
// peer's rows (peer_pairs: each peer's count), so that what the peers receive sums to what they send.
// first_expert, experts_of: each peer's range of experts (sub-rank order); me: this processor's peer.
template <class Comm>
ragged_routes route_rows(Comm& comm, axis_set axes, int me, const std::vector<std::int64_t>& first_expert,
                         const std::vector<std::int64_t>& experts_of, std::int64_t experts, const std::int64_t* chosen,
                         std::int64_t pairs, const std::vector<std::int64_t>& peer_pairs) {
  ragged_routes r;
  const int peers = static_cast<int>(first_expert.size());
  r.local_experts = experts_of[static_cast<std::size_t>(me)];
  r.pairs = pairs;
  const std::int64_t widest = *std::max_element(experts_of.begin(), experts_of.end());
  // Rows per expert here, sorted by (peer, expert) then pair: a counting sort.
  const auto even_share = [&](std::int64_t of, std::int64_t e) { return of / experts + (e < of % experts ? 1 : 0); };
  std::vector<std::int64_t> per_expert(static_cast<std::size_t>(experts), 0);
  const bool planned = chosen == nullptr;
  if (!planned)  // top_k's indices over the experts: in range by construction
    for (std::int64_t i = 0; i < pairs; ++i) ++per_expert[static_cast<std::size_t>(chosen[i])];
  else
    for (std::int64_t e = 0; e < experts; ++e) per_expert[static_cast<std::size_t>(e)] = even_share(pairs, e);
  std::vector<std::int64_t> start(static_cast<std::size_t>(experts), 0);
  std::vector<int> counts_to(static_cast<std::size_t>(peers * widest), 0);
  r.send_rows.assign(static_cast<std::size_t>(peers), 0);
  std::int64_t at = 0;
  for (int q = 0; q < peers; ++q)
    for (std::int64_t j = 0; j < experts_of[q]; ++j) {
      const auto e = static_cast<std::size_t>(first_expert[q] + j);
      start[e] = at;
      at += per_expert[e];
      r.send_rows[q] += static_cast<int>(per_expert[e]);
      counts_to[static_cast<std::size_t>(q * widest + j)] = static_cast<int>(per_expert[e]);
    }
  r.order.assign(static_cast<std::size_t>(pairs), 0);
  r.place.assign(static_cast<std::size_t>(pairs), 0);
  for (std::int64_t i = 0; i < pairs; ++i) {
    const auto e = static_cast<std::size_t>(planned ? i % experts : chosen[i]);
    r.place[static_cast<std::size_t>(i)] = start[e];
    r.order[static_cast<std::size_t>(start[e]++)] = i;
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
  r.recv_rows.assign(static_cast<std::size_t>(peers), 0);
  r.expert_rows.assign(static_cast<std::size_t>(r.local_experts), 0);
  for (int s = 0; s < peers; ++s)
    for (std::int64_t j = 0; j < r.local_experts; ++j) {
      const int n = counts_from[static_cast<std::size_t>(s * widest + j)];
      r.recv_rows[s] += n;
      r.expert_rows[static_cast<std::size_t>(j)] += n;
    }
  for (const int n : r.recv_rows) r.received += n;
  // Received: peer by peer, each peer's rows by expert. Grouped: expert by expert, peer by peer.
  std::vector<std::int64_t> next(static_cast<std::size_t>(r.local_experts), 0);
  for (std::int64_t j = 1; j < r.local_experts; ++j) next[j] = next[j - 1] + r.expert_rows[j - 1];
  r.grouped_at.assign(static_cast<std::size_t>(r.received), 0);
  r.received_at.assign(static_cast<std::size_t>(r.received), 0);
  std::int64_t pos = 0;
  for (int s = 0; s < peers; ++s)
    for (std::int64_t j = 0; j < r.local_experts; ++j)
      for (int n = 0; n < counts_from[static_cast<std::size_t>(s * widest + j)]; ++n, ++pos) {
        r.grouped_at[static_cast<std::size_t>(pos)] = next[j];
        r.received_at[static_cast<std::size_t>(next[j]++)] = pos;
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

// dst's row i = src's row at(i); with sum = k > 0, the sum of src's rows at(i k) ... at(i k + k - 1)
// (x's gradient: a token's k choices). Rows of `width`.
template <class Exec, class V>
void gather_rows(const V& dst, const V& src, const index_view<Exec>& at, std::int64_t rows, std::int64_t width,
                 std::int64_t sum = 0) {
  using T = typename V::value_type;
  if (sum == 0) {
    kernels::parallel_for(
        "meshtensor::ragged_rows", kernels::range<Exec>(0, rows * width), KOKKOS_LAMBDA(std::int64_t i) {
          const std::int64_t r = i / width, c = i % width;
          dst(i) = src(at(r) * width + c);
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

// Rows to the peers over axes (send_rows each), received into rows from each (recv_rows).
template <class Exec, class T, class Comm>
Kokkos::View<T*, typename Exec::memory_space> exchange_rows(Comm& comm, axis_set axes,
                                                            const Kokkos::View<T*, typename Exec::memory_space>& send,
                                                            const std::vector<int>& send_rows,
                                                            const std::vector<int>& recv_rows, std::int64_t width) {
  if (axes.empty()) return send;
  const auto counted = [&](const std::vector<int>& rows, std::vector<int>& counts, std::vector<int>& displs) {
    std::int64_t total = 0;
    for (const int n : rows) {
      counts.push_back(checked_count(n * width));
      displs.push_back(checked_count(total));
      total += n * width;
    }
    return total;
  };
  std::vector<int> sc, sd, rc, rd;
  counted(send_rows, sc, sd);
  const std::int64_t received = counted(recv_rows, rc, rd);
  auto recv = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(received));
  const auto out = mpi_buffer<Exec, T>::reading(send);
  const auto in = mpi_buffer<Exec, T>::receiving_into(recv);
  alltoallv(comm, axes, false, out.data(), sc, sd, in.data(), rc, rd);
  in.copy_into(recv);
  return recv;
}

// The SwiGLU experts' weights of this processor as flat views: [experts, M, F] twice, [experts, F, M].
template <class Exec, class T>
struct expert_weights {
  Kokkos::View<T*, typename Exec::memory_space> gate, up, down;
  std::int64_t d_model, d_ff;  // d_ff: this processor's slice of an expert's width
  axis_set width_axes;         // DFf's: the products over it are partial sums there
};

// A range of a flat view, as the products take it.
template <class V>
V part(const V& v, std::int64_t first, std::int64_t n) {
  return V(Kokkos::subview(v, std::make_pair(first, first + n)));
}

// What the backward pass reads: the routes, the experts' rows and their products' inputs.
template <class Exec, class T>
struct ragged_saved {
  ragged_routes routes;
  index_view<Exec> order, place, grouped_at, received_at;
  temporary_view<T, typename Exec::memory_space> rows, gate, up;  // grouped: [received, M], [received, F] twice
  ragged_saved(ragged_routes r, std::int64_t d_model, std::int64_t d_ff)
      : routes(std::move(r)),
        order(index_table<Exec>(routes.order)),
        place(index_table<Exec>(routes.place)),
        grouped_at(index_table<Exec>(routes.grouped_at)),
        received_at(index_table<Exec>(routes.received_at)),
        rows(static_cast<std::size_t>(routes.received * d_model)),
        gate(static_cast<std::size_t>(routes.received * d_ff)),
        up(static_cast<std::size_t>(routes.received * d_ff)) {}
};

// Forward: x's rows (tokens x M, token-major) through their chosen experts, to out (pairs x M).
template <class Exec, class T, class Comm>
Kokkos::View<T*, typename Exec::memory_space> ragged_forward(Comm& comm, axis_set axes, const ragged_saved<Exec, T>& s,
                                                             const Kokkos::View<T*, typename Exec::memory_space>& x,
                                                             const expert_weights<Exec, T>& w, std::int64_t k) {
  using V = Kokkos::View<T*, typename Exec::memory_space>;
  const auto& r = s.routes;
  const std::int64_t m = w.d_model, f = w.d_ff;
  const V send = rows_buffer<Exec, T>(r.pairs, m);
  gather_rows<Exec>(send, x, index_table<Exec>([&] {
                      std::vector<std::int64_t> token(r.order.size());
                      for (std::size_t p = 0; p < token.size(); ++p) token[p] = r.order[p] / k;
                      return token;
                    }()),
                    r.pairs, m);
  const V received = exchange_rows<Exec, T>(comm, axes, send, r.send_rows, r.recv_rows, m);
  gather_rows<Exec>(s.rows.v, received, s.received_at, r.received, m);
  const temporary_view<T, typename Exec::memory_space> hidden(static_cast<std::size_t>(r.received * f)),
      done(static_cast<std::size_t>(r.received * m));
  std::int64_t first = 0;
  for (std::int64_t j = 0; j < r.local_experts; ++j) {
    const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
    kernels::product<Exec, T>(1, n, f, m, false, false, part(s.rows.v, first * m, n * m), part(w.gate, j * m * f, m * f),
                              part(s.gate.v, first * f, n * f));
    kernels::product<Exec, T>(1, n, f, m, false, false, part(s.rows.v, first * m, n * m), part(w.up, j * m * f, m * f),
                              part(s.up.v, first * f, n * f));
    first += n;
  }
  const V g = s.gate.v, u = s.up.v, h = hidden.v;
  kernels::parallel_for(
      "meshtensor::ragged_swiglu", kernels::range<Exec>(0, r.received * f), KOKKOS_LAMBDA(std::int64_t i) {
        h(i) = T(fn::silu_fn::f(compute_t<T>(g(i))) * compute_t<T>(u(i)));
      });
  first = 0;
  for (std::int64_t j = 0; j < r.local_experts; ++j) {
    const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
    kernels::product<Exec, T>(1, n, m, f, false, false, part(h, first * f, n * f), part(w.down, j * f * m, f * m),
                              part(done.v, first * m, n * m));
    first += n;
  }
  // From here the rows are those the router sent this processor's experts: as many as it chose.
  const routed_bytes routed(comm);
  allreduce_slice<Exec, T>(comm, done.v, w.width_axes, reduce_op::sum);
  const V back_send = rows_buffer<Exec, T>(r.received, m);
  gather_rows<Exec>(back_send, done.v, s.grouped_at, r.received, m);
  const V back = exchange_rows<Exec, T>(comm, axes, back_send, r.recv_rows, r.send_rows, m);
  const V out = rows_buffer<Exec, T>(r.pairs, m);
  gather_rows<Exec>(out, back, s.place, r.pairs, m);
  return out;
}

template <class Exec, class T>
struct ragged_gradients {
  Kokkos::View<T*, typename Exec::memory_space> x, gate, up, down;
};

// Backward: out's gradient (pairs x M) to x's (tokens x M) and the weights'.
template <class Exec, class T, class Comm>
ragged_gradients<Exec, T> ragged_backward(Comm& comm, axis_set axes, const ragged_saved<Exec, T>& s,
                                          const Kokkos::View<T*, typename Exec::memory_space>& d_out,
                                          const expert_weights<Exec, T>& w, std::int64_t tokens, std::int64_t k) {
  using V = Kokkos::View<T*, typename Exec::memory_space>;
  using Tmp = temporary_view<T, typename Exec::memory_space>;
  const auto& r = s.routes;
  const std::int64_t m = w.d_model, f = w.d_ff, e_here = r.local_experts;
  const V send = rows_buffer<Exec, T>(r.pairs, m);
  gather_rows<Exec>(send, d_out, s.order, r.pairs, m);
  const V received = exchange_rows<Exec, T>(comm, axes, send, r.send_rows, r.recv_rows, m);
  const Tmp d_done(static_cast<std::size_t>(r.received * m)), hidden(static_cast<std::size_t>(r.received * f)),
      d_hidden(static_cast<std::size_t>(r.received * f)), d_rows(static_cast<std::size_t>(r.received * m)),
      d_rows_up(static_cast<std::size_t>(r.received * m));
  gather_rows<Exec>(d_done.v, received, s.received_at, r.received, m);
  ragged_gradients<Exec, T> d{V(), rows_buffer<Exec, T>(e_here, m * f), rows_buffer<Exec, T>(e_here, m * f),
                              rows_buffer<Exec, T>(e_here, f * m)};
  const V g = s.gate.v, u = s.up.v, h = hidden.v, dh = d_hidden.v;
  kernels::parallel_for(
      "meshtensor::ragged_swiglu", kernels::range<Exec>(0, r.received * f), KOKKOS_LAMBDA(std::int64_t i) {
        h(i) = T(fn::silu_fn::f(compute_t<T>(g(i))) * compute_t<T>(u(i)));
      });
  std::int64_t first = 0;
  for (std::int64_t j = 0; j < e_here; ++j) {
    const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
    if (n == 0) {  // an expert no token chose: its weights' gradients are zero (no product over 0 rows)
      kernels::deep_copy(part(d.gate, j * m * f, m * f), T(0));
      kernels::deep_copy(part(d.up, j * m * f, m * f), T(0));
      kernels::deep_copy(part(d.down, j * f * m, f * m), T(0));
      continue;
    }
    kernels::product<Exec, T>(1, n, f, m, false, true, part(d_done.v, first * m, n * m), part(w.down, j * f * m, f * m),
                              part(dh, first * f, n * f));
    kernels::product<Exec, T>(1, f, m, n, true, false, part(h, first * f, n * f), part(d_done.v, first * m, n * m),
                              part(d.down, j * f * m, f * m));
    first += n;
  }
  // dh becomes the gate's gradient, h the up projection's (h is read no more).
  kernels::parallel_for(
      "meshtensor::ragged_swiglu_grad", kernels::range<Exec>(0, r.received * f), KOKKOS_LAMBDA(std::int64_t i) {
        const compute_t<T> gi = g(i), ui = u(i), dhi = dh(i), si = fn::silu_fn::f(gi);
        h(i) = T(dhi * si);
        dh(i) = T(dhi * ui * fn::silu_fn::df(gi, si));
      });
  first = 0;
  for (std::int64_t j = 0; j < e_here; ++j) {
    const std::int64_t n = r.expert_rows[static_cast<std::size_t>(j)];
    if (n == 0) continue;
    const V rows_j = part(s.rows.v, first * m, n * m), dg_j = part(dh, first * f, n * f), du_j = part(h, first * f, n * f);
    kernels::product<Exec, T>(1, m, f, n, true, false, rows_j, dg_j, part(d.gate, j * m * f, m * f));
    kernels::product<Exec, T>(1, m, f, n, true, false, rows_j, du_j, part(d.up, j * m * f, m * f));
    kernels::product<Exec, T>(1, n, m, f, false, true, dg_j, part(w.gate, j * m * f, m * f), part(d_rows.v, first * m, n * m));
    kernels::product<Exec, T>(1, n, m, f, false, true, du_j, part(w.up, j * m * f, m * f), part(d_rows_up.v, first * m, n * m));
    first += n;
  }
  const V a = d_rows.v, b = d_rows_up.v;
  kernels::parallel_for(
      "meshtensor::ragged_rows_add", kernels::range<Exec>(0, r.received * m),
      KOKKOS_LAMBDA(std::int64_t i) { a(i) = T(compute_t<T>(a(i)) + compute_t<T>(b(i))); });
  const routed_bytes routed(comm);
  allreduce_slice<Exec, T>(comm, a, w.width_axes, reduce_op::sum);
  const V back_send = rows_buffer<Exec, T>(r.received, m);
  gather_rows<Exec>(back_send, a, s.grouped_at, r.received, m);
  const V back = exchange_rows<Exec, T>(comm, axes, back_send, r.recv_rows, r.send_rows, m);
  d.x = rows_buffer<Exec, T>(tokens, m);
  gather_rows<Exec>(d.x, back, s.place, tokens, m, k);
  return d;
}

}  // namespace meshtensor::detail

namespace meshtensor::detail {

// The collectives ragged_experts runs forward: the counts, the rows out and the rows back, each one
// alltoall over Experts' axes (none where Experts is not split); where DFf is split, an allreduce
// of the experts' results over its axes.
template <class Dims, Tensor X>
constexpr comm_plan ragged_experts_plan() {
  using W = moe_t<X, typename Dims::experts, typename Dims::d_model, typename Dims::d_ff>;
  return comm_plan{}
      .then(collective::alltoall, W::layout_type::template split_of<typename Dims::experts>().mask(), 3)
      .then(collective::allreduce, W::layout_type::template split_of<typename Dims::d_ff>().mask());
}

// x[G, S, M] through the experts chosen[G, S, K] picks (ints, off the tape): [G, S, K, M], split as
// x. The operands in these dims' orders (routed_moe transposes them); the layout's fit is checked
// here, at run time and alike on every processor (from the layout and the mesh's sizes), so that
// routed_moe compiles for every layout and refuses the ragged dispatch by name where it cannot run.
template <class Dims, Tensor X, Tensor I, Tensor WI, Tensor WO>
auto ragged_experts(const X& x, const I& chosen, const WI& w_gate, const WI& w_up, const WO& w_down) {
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
  const op_call call(planned_op{"ragged_experts", ragged_experts_plan<Dims, X>()}, x);
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
  kernels::fence(Exec{});  // the router's choice is read on the host
  std::vector<std::int64_t> choices;
  if (!comm.planned()) {
    const auto h = kernels::copy_to(Kokkos::HostSpace{}, chosen.view());
    choices.assign(h.data(), h.data() + tokens * k);
  }
  auto saved = std::make_shared<ragged_saved<Exec, T>>(
      route_rows(comm, expert_axes, me, first, held, experts,
                 comm.planned() ? nullptr : choices.data(), tokens * k, peer_pairs),
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
        const auto push = [&](const auto& weight, auto&& grad) {
          if constexpr (partial.empty()) push_fresh_grad(weight, std::move(grad));
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
