#pragma once
// ring_causal_attention<Length, MemLength, DModel, Heads, DKv>(x, wq, wk, wv, wo): causal attention
// of a sequence split over mesh axes (context parallelism as ring attention and Megatron-Core do
// it). x's Length is split over axes A into P contiguous blocks (its layout's rule, uneven extents
// included), or cut zigzag<Length, A...> (part p's block two chunks, p and 2P - 1 - p of 2P: every
// processor then computes the same under the causal mask, the blocks being computed chunk pair by
// chunk pair, pairs wholly in the future skipped); q, k and v are computed where the positions
// are. Then P steps: at step s each
// processor holds the k and v block of the processor s places before it along the ring of A,
// attends its q block to it with an online softmax (running max and sum per row, in float or wider
// accumulators) under the causal mask in global positions, and passes the block on; a block wholly
// in the future of the q block is not computed, but still passed. The result is causal_attention's
// under x's layout. Heads may be split over other axes (tensor parallelism: the output projection
// allreduces over them, as causal_attention's), the batch dims too (data parallelism).
// ring_grouped_causal_attention<Length, MemLength, DModel, KvHeads, Group, DKv>(x, wq, wk, wv, wo):
// the same for grouped-query attention (grouped_causal_attention's weights and result): q's heads
// are [KvHeads, Group], k's and v's KvHeads, and each query head attends with its KV head's block.
// The kernels are one code path: multi-head attention is Group = 1. KvHeads and Group may be split
// over axes other than A's (the output projection allreduces over them).
// Both take an optional key_bias (after wo): causal_attention's and attention's, [x's dims other
// than Length and DModel, MemLength] (nn::padding_bias), added to the logits before the scale, a
// constant (no gradient). Every processor holds it whole along MemLength (its layout must not
// split MemLength; x's other dims split as x's), and each block's scores take the bias at that
// block's global key positions (both chunks' under zigzag).
// Communication: P - 1 shifts over A forward (k and v, one message a step), P backward (k, v and
// the dk, dv partial sums of the block P - 1 times, then the finished dk, dv home once); the output
// projection allreduces over the heads' own axes. The key bias adds nothing: it is read where it
// is, not sent with k and v. It is one number per key per sequence (2 |heads| |DKv| times fewer
// than a k, v block) and the same for every layer, so making it whole along MemLength once per step
// (padding_bias of ids split like x: one allgather of batch x Length over A, its relayout's) costs
// less than adding it to the 2P - 1 messages of every layer, forward and backward; its price is
// batch x Length numbers per processor (the plans and ring_attention_traffic_of are the
// same with and without it). Under grouped-query attention the blocks that
// travel are k's and v's at KvHeads, Group times fewer bytes than broadcasting them over the group
// (q never travels); with Group split over axes that do not split KvHeads, k and v are replicated
// there and the backward pass adds one allreduce of dk and dv over them. Besides its own q, k and
// v, each processor holds two k, v blocks at a time (the one computed and the one arriving), never
// the whole sequence, and the scores of one tile of keys at a time: each block is computed in
// tiles of at most 512 keys (ring_tile_keys), each tile's scores [local query rows, tile] one batched
// product (kernels::product) in the accumulator type, then the online softmax's row kernel, then
// the product with the tile's values (flash attention's way: kernels/attention_tiles.hpp).
// The backward pass runs the ring again (recomputing each block's scores from q, k, v and the
// per-row log-sum-exp kept by the forward pass): dq accumulates where it is, dk and dv travel with
// their block, summed over the group's query heads that share each KV head. The ring keeps q, k, v,
// the heads' output and the log-sum-exp per row for the backward pass, never the softmax's weights
// (so it takes no attention_memory: recomputing the core is what it does already).
// ring_grouped_causal_attention's rope form rotates q and k (nn/rope.hpp) at their global positions
// before the ring starts: the blocks travel rotated.
// Gradient: through x and every weight.
#include <Kokkos_Core.hpp>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../element/bf16.hpp"
#include "../element/kokkos_math.hpp"
#include "../geometry/placement.hpp"
#include "../kernels/attention_tiles.hpp"
#include "../kernels/launch.hpp"
#include "../kernels/pool.hpp"
#include "../ops/einsum.hpp"
#include "../ops/op_call.hpp"
#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "../tensor/mpi_buffer.hpp"
#include "../tensor/ring_hop.hpp"
#include "attention.hpp"
#include "detail/ring_geometry.hpp"
#include "ring_attention_traffic.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Length>
struct ring_attention_needs_a_split_length {
  static_assert(sizeof(Length) == 0,
                "meshtensor: ring_causal_attention passes blocks of a split sequence around a ring; x's layout "
                "does not split Length: use causal_attention (ring_grouped_causal_attention: "
                "grouped_causal_attention)");
};
template <class MemLength>
struct ring_attention_memory_length_split {
  static_assert(sizeof(MemLength) == 0,
                "meshtensor: ring_causal_attention keeps the keys' positions in x's Length split; the layout "
                "must not split MemLength");
};
template <class Heads>
struct ring_attention_heads_on_a_context_axis {
  static_assert(sizeof(Heads) == 0,
                "meshtensor: ring_causal_attention: a context axis also used for heads under the ring; split "
                "Heads over axes that do not split Length (ring_grouped_causal_attention: KvHeads and Group)");
};
template <class DKv>
struct ring_attention_dkv_split {
  static_assert(sizeof(DKv) == 0,
                "meshtensor: ring_causal_attention computes each score on one processor; the layout must not "
                "split DKv");
};
template <class Bias, class Expected>
struct ring_attention_key_bias_dims {
  static_assert(sizeof(Bias) == 0,
                "meshtensor: ring_causal_attention's key_bias is per key of each sequence: its dims must be x's "
                "other than Length and DModel, in x's order, then MemLength (Expected; padding_bias<Length, "
                "MemLength>(ids) of ids [batch, Length] gives [batch, MemLength])");
};
template <class MemLength>
struct ring_attention_key_bias_split {
  static_assert(sizeof(MemLength) == 0,
                "meshtensor: ring_causal_attention reads the travelling block's bias at its keys' positions, so "
                "every processor holds the whole key_bias along MemLength: its layout must not split MemLength");
};
template <class D>
struct ring_attention_key_bias_batch_split {
  static_assert(sizeof(D) == 0,
                "meshtensor: ring_causal_attention's key_bias must split its dim D (a dim of x such as batch) "
                "over the same axes as x does, so that its rows are x's sequences");
};
}  // namespace diagnostic

namespace detail {

// The ring's step: its plan is ring_attention_plan of the run's number of parts.
struct ring_op {
  const char* name;
  axis_set axes;
  std::int64_t parts;
  comm_plan plan() const { return ring_attention_plan(axes, parts); }
};

// The key bias in C (ring_key_bias) for a ring of geometry `ring` over `length` positions: none
// for no_key_bias; else the bias tensor's local array (its own memory where its elements are
// C's), whose rows are the local batch.
template <class Exec, class C, class Bias>
ring_key_bias<Kokkos::View<C*, typename Exec::memory_space>> ring_key_bias_of(const Bias& key_bias,
                                                                            const ring_geometry& ring,
                                                                            std::int64_t length) {
  ring_key_bias<Kokkos::View<C*, typename Exec::memory_space>> kb;
  if constexpr (!std::is_same_v<Bias, no_key_bias>) {
    kb.values = ring_in_compute_type<Exec, C>(key_bias.view());
    kb.length = length;
    const std::int64_t batch = length > 0 ? key_bias.local_size() / length : 0;
    kb.heads = batch > 0 ? ring.kv_outer / batch : 1;
  }
  return kb;
}

// The ring's backward pass: dq, dk, dv of the core from its output's gradient g.
template <Dim Length, Tensor Q, Tensor K, class CV, class Bias>
void ring_core_backward(const Q& g, const Q& q, const K& k, const K& v, const Q& out, const CV& lse, double scale,
                        const Bias& key_bias) {
  using T = typename Q::value_type;
  using C = typename CV::value_type;
  using Exec = typename Q::execution_space;
  using Mem = typename Q::memory_space;
  using CPool = view_pool<C, Mem>;
  const collective_subject subject(&Q::type_name);
  communicator& comm = q.mesh().communicator();
  const ring_geometry ring = ring_geometry_of<Length>(q, k);
  const std::int64_t P = ring.parts, nq = ring.extent[static_cast<std::size_t>(ring.me)], kv_outer = ring.kv_outer,
                     group = ring.group, inner = ring.inner, rows = kv_outer * group * nq;
  const C s = static_cast<C>(scale);
  // A plan's claims on the pool's scratch below that lives to the end (planned_claim): the run's
  // peak holds it.
  std::vector<std::shared_ptr<void>> scratch;
  const auto kb = ring_key_bias_of<Exec, C>(key_bias, ring, q.template extent<Length>());
  scratch.push_back(planned_claim(kb.values));
  // delta = rowsum(dO * O), per query row.
  const auto delta = CPool::get().allocate(static_cast<std::size_t>(rows));
  scratch.push_back(planned_claim(delta));
  ring_row_dots<Exec>(g.view(), out.view(), delta, rows, inner);
  const auto dq = CPool::get().allocate(static_cast<std::size_t>(rows * inner));
  scratch.push_back(planned_claim(dq));
  kernels::deep_copy(dq, C(0));
  // The travelling message [k; v; dk; dv] of one block, in C (dk and dv are sums of P parts).
  const auto own_blk = ring.block(ring.me);
  auto cur = CPool::get().allocate(static_cast<std::size_t>(4 * own_blk));
  auto cur_claim = planned_claim(cur);  // released when cur moves on to the next message
  ring_pack_message<Exec>(k.view(), v.view(), cur, own_blk);
  using buffer = mpi_buffer<Exec, C>;
  using CView = Kokkos::View<C*, Mem>;
  using TView = Kokkos::View<T*, Mem>;
  // q and dO as they lie: the products' operands (kernels::product_to).
  const TView qc(q.view().data(), q.view().extent(0)), gc(g.view().data(), g.view().extent(0));
  CView home(cur.data() + 2 * own_blk, static_cast<std::size_t>(2 * own_blk));  // this part's [dk; dv]
  // Keeps home's memory alive (home does not count as its reference): the first message only
  // where it is home (P == 1); else the last step's, so that the ring holds two messages, not three.
  CView home_owner = P == 1 ? cur : CView();
  std::shared_ptr<void> home_claim;
  // Per query chunk: its rows of q, dO, lse and delta, and its dq (q's own arrays where the part is
  // one chunk).
  const auto me = static_cast<std::size_t>(ring.me);
  const int q_chunks = ring.chunk_extent[me][1] > 0 ? 2 : 1;
  const std::int64_t heads_rows = kv_outer * group;
  std::array<TView, 2> qcs{qc, TView()}, gcs{gc, TView()};
  std::array<CView, 2> lses{lse, CView()}, deltas{delta, CView()}, dqs{dq, CView()};
  if (q_chunks == 2)
    for (int c = 0; c < 2; ++c) {
      const std::int64_t b = ring.chunk_start(ring.me, c), n = ring.chunk_extent[me][c];
      qcs[c] = ring_chunk_rows<Exec>(qc, heads_rows, nq, inner, b, n);
      gcs[c] = ring_chunk_rows<Exec>(gc, heads_rows, nq, inner, b, n);
      lses[c] = ring_chunk_rows<Exec>(lse, heads_rows, nq, std::int64_t{1}, b, n);
      deltas[c] = ring_chunk_rows<Exec>(CView(delta), heads_rows, nq, std::int64_t{1}, b, n);
      dqs[c] = CPool::get().allocate(static_cast<std::size_t>(heads_rows * n * inner));
      for (const TView* chunk : {&qcs[c], &gcs[c]}) scratch.push_back(planned_claim(*chunk));
      for (const CView* chunk : {&lses[c], &deltas[c], &dqs[c]}) scratch.push_back(planned_claim(*chunk));
      kernels::deep_copy(dqs[c], C(0));
    }
  for (int step = 0; step < P; ++step) {
    const int j = ring.part(step);
    const std::int64_t nk = ring.extent[static_cast<std::size_t>(j)];
    const auto compute = [&, j, nk] {
      if (rows == 0) return;  // no q row here (a part of an uneven group split)
      for (int c = 0; c < 2; ++c)
        for (int e = 0; e < 2; ++e) {
          if (!ring.visible(c, j, e)) continue;
          const std::int64_t tb = ring.chunk_start(j, e);
          ring_backward_block<Exec>(qcs[c], gcs[c], lses[c], deltas[c], cur, dqs[c], kv_outer, group,
                                    ring.chunk_extent[me][c], nk, inner, ring.chunk_offset[me][c],
                                    ring.chunk_offset[static_cast<std::size_t>(j)][e], s, tb,
                                    tb + ring.chunk_extent[static_cast<std::size_t>(j)][e], kb);
        }
    };
    if (P == 1) {
      compute();
      break;
    }
    // Steps 0 .. P - 2 pass the whole message on; the last passes the finished dk, dv of the
    // block it holds (the next part's) home, and receives this part's.
    const bool last = step == P - 1;
    const std::int64_t send_n = last ? 2 * ring.block(j) : 4 * ring.block(j);
    const std::int64_t recv_n = last ? 2 * own_blk : 4 * ring.block(ring.part(step + 1));
    auto arrived = ring_hop<Exec>(comm, ring.axes, ring.to, ring.from,
                                  CView(cur.data() + (last ? 2 * ring.block(j) : 0), static_cast<std::size_t>(send_n)),
                                  send_n, recv_n, false, compute);
    if (last) {
      home = home_owner = arrived.view;
      home_claim = std::move(arrived.claim);
    } else {
      cur = arrived.view;
      cur_claim = std::move(arrived.claim);
    }
  }
  if (q_chunks == 2)
    for (int c = 0; c < 2; ++c)
      copy_rows_in<Exec>(dqs[c], heads_rows, nq, inner, ring.chunk_start(ring.me, c), ring.chunk_extent[me][c],
                                CView(dq));
  // With the group split over axes that do not split k and v (which are replicated there), the
  // dk and dv of the group's parts summed: one allreduce of [dk; dv].
  constexpr axis_set group_axes = ring_group_axes<Q, K>();
  if constexpr (!group_axes.empty()) {
    const auto sum = buffer::reading(home);
    allreduce(comm, group_axes, sum.data(), 2 * own_blk);
    home = home_owner = sum.view();
  }
  // Back to T: dq here, and this part's dk and dv.
  Q gq(q.mesh(), q.extents());
  K gk(k.mesh(), k.extents()), gvv(k.mesh(), k.extents());
  ring_round_into<Exec>(dq, gq.view(), "meshtensor::ring_attention_unpack_dq");
  ring_round_into<Exec>(home, gk.view(), "meshtensor::ring_attention_unpack_dk");
  ring_round_into<Exec>(CView(home.data() + own_blk, static_cast<std::size_t>(own_blk)), gvv.view(),
                        "meshtensor::ring_attention_unpack_dv");
  push_fresh_grad(q, std::move(gq));
  push_fresh_grad(k, std::move(gk));
  push_fresh_grad(v, std::move(gvv));
}

// The ring itself: softmax(q . k / sqrt(|DKv|), causal) . v with q [B..., QHeads..., Length, DKv]
// and k, v [B..., KvHeads..., Length, DKv] (keys at the same positions as the queries), Length
// split over the ring's axes; QHeads is KvHeads followed by the group's dim (or KvHeads itself:
// multi-head attention). `name` names the op. key_bias: no_key_bias, or the whole bias [local
// batch, MemLength] (ring_key_bias), a constant.
template <Dim Length, Tensor Q, Tensor K, class Bias>
Q ring_core(const Q& q, const K& k, const K& v, double scale, const char* name, const Bias& key_bias) {
  using T = typename Q::value_type;
  using C = compute_t<T>;
  using Exec = typename Q::execution_space;
  using Mem = typename Q::memory_space;
  using CPool = view_pool<C, Mem>;
  const ring_geometry ring = ring_geometry_of<Length>(q, k);
  const op_call call(ring_op{name, ring.axes, ring.parts}, q);
  const collective_subject subject(&Q::type_name);
  communicator& comm = q.mesh().communicator();
  const std::int64_t P = ring.parts, nq = ring.extent[static_cast<std::size_t>(ring.me)], kv_outer = ring.kv_outer,
                     group = ring.group, inner = ring.inner, rows = kv_outer * group * nq;
  const C s = static_cast<C>(scale);
  using CView = Kokkos::View<C*, Mem>;
  std::vector<std::shared_ptr<void>> scratch;  // a plan's claims on the scratch below (planned_claim)
  const auto kb = ring_key_bias_of<Exec, C>(key_bias, ring, q.template extent<Length>());
  scratch.push_back(planned_claim(kb.values));
  // Per query chunk (ring_geometry): the online softmax's running max m, sum l and weighted sum acc
  // of its rows.
  const auto me = static_cast<std::size_t>(ring.me);
  const int q_chunks = ring.chunk_extent[me][1] > 0 ? 2 : 1;
  const std::int64_t heads_rows = kv_outer * group;
  std::array<CView, 2> ms, ls, accs;
  for (int c = 0; c < q_chunks; ++c) {
    const std::int64_t n = q_chunks == 1 ? nq : ring.chunk_extent[me][c];
    ms[c] = CPool::get().allocate(static_cast<std::size_t>(heads_rows * n));
    ls[c] = CPool::get().allocate(static_cast<std::size_t>(heads_rows * n));
    accs[c] = CPool::get().allocate(static_cast<std::size_t>(heads_rows * n * inner));
    for (const CView* sums : {&ms[c], &ls[c], &accs[c]}) scratch.push_back(planned_claim(*sums));
    kernels::deep_copy(ms[c], std::numeric_limits<C>::lowest());
    kernels::deep_copy(ls[c], C(0));
    kernels::deep_copy(accs[c], C(0));
  }
  // The travelling message [k; v] of one block, in T.
  using TPool = view_pool<T, Mem>;
  const auto own_blk = ring.block(ring.me);
  auto cur = TPool::get().allocate(static_cast<std::size_t>(2 * own_blk));
  auto cur_claim = planned_claim(cur);
  kernels::deep_copy(Kokkos::View<T*, Mem>(cur.data(), static_cast<std::size_t>(own_blk)), k.view());
  kernels::deep_copy(Kokkos::View<T*, Mem>(cur.data() + own_blk, static_cast<std::size_t>(own_blk)), v.view());
  using TView = Kokkos::View<T*, Mem>;
  const TView qc(q.view().data(), q.view().extent(0));  // q as it lies: the products' operand
  std::array<TView, 2> qcs{qc, TView()};
  if (q_chunks == 2)
    for (int c = 0; c < 2; ++c) {
      qcs[c] = ring_chunk_rows<Exec>(qc, heads_rows, nq, inner, ring.chunk_start(ring.me, c), ring.chunk_extent[me][c]);
      scratch.push_back(planned_claim(qcs[c]));
    }
  for (int step = 0; step < P; ++step) {
    const int j = ring.part(step);
    const std::int64_t nk = ring.extent[static_cast<std::size_t>(j)];
    const auto compute = [&, j, nk] {
      if (rows == 0) return;
      for (int c = 0; c < 2; ++c)
        for (int e = 0; e < 2; ++e) {
          if (!ring.visible(c, j, e)) continue;
          const std::int64_t tb = ring.chunk_start(j, e);
          ring_forward_block<Exec>(qcs[c], cur, ms[c], ls[c], accs[c], kv_outer, group, ring.chunk_extent[me][c], nk,
                                   inner, ring.chunk_offset[me][c], ring.chunk_offset[static_cast<std::size_t>(j)][e], s,
                                   tb, tb + ring.chunk_extent[static_cast<std::size_t>(j)][e], kb);
        }
    };
    if (step == P - 1) {  // the last block: nothing more to pass
      compute();
      break;
    }
    const std::int64_t send_n = 2 * ring.block(j), recv_n = 2 * ring.block(ring.part(step + 1));
    auto arrived = ring_hop<Exec>(comm, ring.axes, ring.to, ring.from, cur, send_n, recv_n, true, compute);
    cur = arrived.view;
    cur_claim = std::move(arrived.claim);
  }
  // o = acc / l; lse = m + log(l), what the backward pass recomputes the weights from.
  Q out(q.mesh(), q.extents(), uninitialized);  // the chunks' rows cover the part: every element written
  const auto lse = CPool::get().allocate(static_cast<std::size_t>(rows));
  auto lse_claim = planned_claim(lse);  // kept with lse for the backward pass
  for (int c = 0; c < q_chunks; ++c) {
    const std::int64_t n = q_chunks == 1 ? nq : ring.chunk_extent[me][c], b = q_chunks == 1 ? 0 : ring.chunk_start(ring.me, c);
    ring_finish_rows<Exec>(ms[c], ls[c], accs[c], out.view(), lse, heads_rows, n, nq, b, inner);
  }
  record<Q>(
      out,
      [q, k, v, o = out.detached(), lse, lse_claim = std::move(lse_claim), scale, key_bias](const Q& g) {
        ring_core_backward<Length>(g, q, k, v, o, lse, scale, key_bias);
      },
      q, k, v);
  return out;
}

}  // namespace detail

namespace detail {

// The first of Ds that L splits over an axis of `axes` (void: none).
template <class L, unsigned Axes, class Ds>
struct first_on_axes {
  using type = void;
};
template <class L, unsigned Axes, class D, class... Ds>
struct first_on_axes<L, Axes, type_list<D, Ds...>> {
  using type = std::conditional_t<(L::template split_of<D>().mask() & Axes) != 0, D,
                                  typename first_on_axes<L, Axes, type_list<Ds...>>::type>;
};

// The first of Ds that layouts L and LB split differently (void: none).
template <class L, class LB, class Ds>
struct first_split_differently {
  using type = void;
};
template <class L, class LB, class D, class... Ds>
struct first_split_differently<L, LB, type_list<D, Ds...>> {
  using type = std::conditional_t<!(L::template split_of<D>() == LB::template split_of<D>()), D,
                                  typename first_split_differently<L, LB, type_list<Ds...>>::type>;
};

// Whether a key bias fits x (no_key_bias: always); else false, after the diagnostic that says why.
template <Dim Length, Dim MemLength, Dim DModel, class X, class Bias>
constexpr bool ring_key_bias_fits() {
  if constexpr (std::is_same_v<Bias, no_key_bias>) {
    return true;
  } else {
    using B = difference_t<typename X::dims, type_list<Length, DModel>>;
    using Expected = concat_t<B, type_list<MemLength>>;
    using LB = typename Bias::layout_type;
    if constexpr (!std::is_same_v<typename Bias::dims, Expected>) {
      (void)sizeof(diagnostic::ring_attention_key_bias_dims<typename Bias::dims, Expected>);
      return false;
    } else if constexpr (LB::template split_of<MemLength>().count != 0) {
      (void)sizeof(diagnostic::ring_attention_key_bias_split<MemLength>);
      return false;
    } else if constexpr (!std::is_void_v<typename first_split_differently<typename X::layout_type, LB, B>::type>) {
      (void)sizeof(diagnostic::ring_attention_key_bias_batch_split<
                   typename first_split_differently<typename X::layout_type, LB, B>::type>);
      return false;
    } else {
      return true;
    }
  }
}

// The ring's attention under x's layout, before the output projection's result type: q's heads
// QHeads (Heads; or KvHeads, Group), k's and v's KvHeads (Heads; or KvHeads), as
// attention_heads_of. The refusals first, at compile time (the diagnostics name the op by the
// multi-head one's name, whose texts the grouped op shares).
template <Dim Length, Dim MemLength, Dim DModel, class QHeads, class KvHeads, Dim DKv, Tensor X, Tensor WQ, Tensor WK,
          Tensor WO, class Bias = no_key_bias>
X ring_attention_of(const char* name, const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo,
                    const Bias& key_bias = {}, const nn::rope_config* rope = nullptr) {
  using L = typename X::layout_type;
  constexpr unsigned length_axes = L::template split_of<Length>().mask();
  using on_context = typename first_on_axes<L, length_axes, QHeads>::type;
  if constexpr (!ring_key_bias_fits<Length, MemLength, DModel, X, Bias>()) {
    return x;
  } else if constexpr (length_axes == 0) {
    (void)sizeof(diagnostic::ring_attention_needs_a_split_length<Length>);
    return x;
  } else if constexpr (L::template split_of<MemLength>().count != 0) {
    (void)sizeof(diagnostic::ring_attention_memory_length_split<MemLength>);
    return x;
  } else if constexpr (!std::is_void_v<on_context>) {
    (void)sizeof(diagnostic::ring_attention_heads_on_a_context_axis<on_context>);
    return x;
  } else if constexpr (L::template split_of<DKv>().count != 0) {
    (void)sizeof(diagnostic::ring_attention_dkv_split<DKv>);
    return x;
  } else {
    const op_call call(composite_op{name});
    using B = difference_t<typename X::dims, type_list<Length, DModel>>;
    if constexpr (!std::is_same_v<Bias, no_key_bias>) {
      // The kernels read the bias at x's positions: extents checked here (global, so every rank
      // throws alike), not found out of bounds on a device. A constant: a bias on the tape would
      // silently get no gradient, where causal_attention's sum gives it one.
      static_assert(std::is_same_v<typename Bias::memory_space, typename X::memory_space>,
                    "meshtensor: ring_causal_attention's key_bias must live in x's memory space");
      const auto refuse = [&](std::string_view dim, std::int64_t got, std::int64_t want) {
        throw shape_error(cat(name, ": key_bias ", Bias::type_name(), key_bias.shape_string(), " has extent ", got,
                              " along '", dim, "' where x ", X::type_name(), x.shape_string(), " has ", want));
      };
      if (key_bias.template extent<MemLength>() != x.template extent<Length>())
        refuse(MemLength::name(), key_bias.template extent<MemLength>(), x.template extent<Length>());
      [&]<class... Bs>(type_list<Bs...>) {
        ((key_bias.template extent<Bs>() != x.template extent<Bs>()
              ? refuse(Bs::name(), key_bias.template extent<Bs>(), x.template extent<Bs>())
              : void()),
         ...);
      }(B{});
      if (key_bias.tracks_grad())
        throw error(cat(name, ": key_bias ", Bias::type_name(), " is on the tape; the ring treats it as a constant "
                              "(no gradient): pass key_bias.detached()"));
    }
    using QDims = concat_t<B, concat_t<QHeads, type_list<Length, DKv>>>;
    using KDims = concat_t<B, concat_t<KvHeads, type_list<Length, DKv>>>;
    const double scale = 1.0 / std::sqrt(static_cast<double>(wq.template extent<DKv>()));
    // Computed where the positions are (local: Length split, the heads as in x's layout), q and k
    // rotated there (rope, at their global positions). The keys keep Length: MemLength names no
    // dim here (the ring's blocks are x's).
    const auto project = [&]<class... Ds>(type_list<Ds...>, const auto& w) { return einsum<Ds...>(x, w); };
    const auto q = with_positions<Length, DKv>(project(QDims{}, wq), rope);  // q's type differs from k's (its group)
    const auto k = with_positions<Length, DKv>(project(KDims{}, wk), rope);
    const auto v = project(KDims{}, wv);
    const auto o = ring_core<Length>(q, k, v, scale, name, key_bias);
    return [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(o, wo); }(typename X::dims{});
  }
}

}  // namespace detail

namespace nn {

// A key bias for the ring: none (no_key_bias, the default) or a tensor [x's dims but Length and
// DModel..., MemLength] (padding_bias), added to the logits before the scale as
// causal_attention's; its layout must not split MemLength (the header).
template <class Bias>
concept ring_key_bias_arg = std::is_same_v<Bias, meshtensor::detail::no_key_bias> || Tensor<Bias>;

template <Dim Length, Dim MemLength, Dim DModel, Dim Heads, Dim DKv, Tensor X, Tensor W, Tensor WO,
          ring_key_bias_arg Bias = meshtensor::detail::no_key_bias>
X ring_causal_attention(const X& x, const W& wq, const W& wk, const W& wv, const WO& wo, const Bias& key_bias = {}) {
  return meshtensor::detail::ring_attention_of<Length, MemLength, DModel, type_list<Heads>, type_list<Heads>, DKv>(
      "ring_causal_attention", x, wq, wk, wv, wo, key_bias);
}

// Grouped-query attention (grouped_causal_attention's weights and result: wq[DModel, KvHeads,
// Group, DKv], wk and wv[DModel, KvHeads, DKv], wo[KvHeads, Group, DKv, DModel]) by the ring: k
// and v travel at KvHeads, Group times fewer bytes than q's heads would.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK,
          Tensor WO, ring_key_bias_arg Bias = meshtensor::detail::no_key_bias>
X ring_grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo,
                                const Bias& key_bias = {}) {
  return meshtensor::detail::ring_attention_of<Length, MemLength, DModel, type_list<KvHeads, Group>, type_list<KvHeads>,
                                               DKv>("ring_grouped_causal_attention", x, wq, wk, wv, wo, key_bias);
}

// With rotary position embeddings (grouped_causal_attention's rope form): q and k rotated at their
// global positions before the ring starts, so the blocks that travel are already rotated.
template <Dim Length, Dim MemLength, Dim DModel, Dim KvHeads, Dim Group, Dim DKv, Tensor X, Tensor WQ, Tensor WK,
          Tensor WO, ring_key_bias_arg Bias = meshtensor::detail::no_key_bias>
X ring_grouped_causal_attention(const X& x, const WQ& wq, const WK& wk, const WK& wv, const WO& wo,
                                const rope_config& rope, const Bias& key_bias = {}) {
  return meshtensor::detail::ring_attention_of<Length, MemLength, DModel, type_list<KvHeads, Group>, type_list<KvHeads>,
                                               DKv>("ring_grouped_causal_attention", x, wq, wk, wv, wo, key_bias, &rope);
}

}  // namespace nn
}  // namespace meshtensor
