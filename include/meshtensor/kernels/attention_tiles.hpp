#pragma once
// The tiled attention kernels of ring attention (nn/ring_attention.hpp drives them over the ring):
// Views and extents, no tensor type. A block of queries [outer, nq, inner] attends to a block of
// keys and values [kv_outer, nk, inner] tile by tile, flash attention's way: per tile of keys one
// batched product for the scores, a row kernel for the causal mask in global positions, the scale
// and the online softmax, a second product with the values; the backward pass recomputes the
// weights from the log-sum-exp per row. The products go through kernels::product (oneDNN,
// OpenBLAS, cuBLAS); scratch comes from the caching allocator (kernels/pool.hpp). While planning
// nothing runs.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "../element/kokkos_math.hpp"
#include "chunk_rows.hpp"
#include "launch.hpp"
#include "pool.hpp"
#include "product.hpp"
#include "product_into_float.hpp"

namespace meshtensor::detail {

// The blockwise kernels, flash attention's way: a block's keys are taken in tiles of at most
// ring_tile_keys positions, and per tile the scores S = q . k_tile^T are one batched product
// (kernels::product: oneDNN, OpenBLAS, cuBLAS), a row kernel applies the causal mask in global
// positions and the scale, updates the online softmax's running max and sum per row and turns S
// into the weights P in place, and a second product gives P . v_tile. The running statistics carry
// from tile to tile and block to block, so that only one tile's scores are ever in memory:
// [outer, nq, tile] in the accumulator type (the backward pass two of them, S and dP), besides
// tiles of k and v gathered contiguous where a block is longer than a tile, or its elements are
// not the accumulator's. A tile wholly in the future of every query of the block is not computed
// (tiles partly in the future are, with the masked weights 0).
//
// The heads: q's rows are [kv_outer, group, nq] (kv_outer: the batch and the KV heads, local;
// group: the local query heads sharing each KV head, 1 under multi-head attention), k's and v's
// [kv_outer, nk]: q's outer index o attends with k's and v's o / group. So q is [kv_outer, group x
// nq, inner] as it lies, and one product per KV head covers its group's query heads (the backward
// products over group x nq rows sum dk and dv over the group).
//
// The products take their operands in the tensors' element type E and write the accumulator type C
// (compute_t<E>: float for bf16, else E itself): for bf16, bf16 operands with float accumulation and
// output (kernels::product_to: oneDNN's AVX512_BF16 kernels, cuBLAS's tensor cores), so q
// and the output's gradient are used as they lie and k's and v's tiles are the message's own memory
// in the forward pass. The scores, the online softmax and the running sums are in C; the weights P
// and their gradient dS are rounded to E for the products that read them, as flash attention's
// bf16 kernels do. Why products: scalar loops over keys and DKv per query row trained about 20x
// slower than the all-to-all attention, whose core is products (docs/performance.md). Why 512: the
// products are then large enough for the providers, and the scratch stays small: with 8192 local
// query rows (4 heads of 2048 positions) one tile's scores are 16 MiB in float (backward 32 MiB),
// not a block's [rows, nk].
inline constexpr std::int64_t ring_tile_keys = 512;

// The tiles of a block's keys tb .. te (global positions from k0) against its nq queries (global
// positions from q0): at most ring_tile_keys keys each, in order, ending before the first tile
// wholly in the future of every query. Both passes walk them.
struct ring_key_tile {
  std::int64_t t0, tn;  // the tile's first key in the block, and its number of keys
  std::int64_t kg, kq;  // its first key's global position, and the same counted from the first query
};
inline std::int64_t ring_tile_length(std::int64_t tb, std::int64_t te) {
  return te - tb < ring_tile_keys ? te - tb : ring_tile_keys;
}
inline std::vector<ring_key_tile> ring_key_tiles(std::int64_t nq, std::int64_t q0, std::int64_t k0, std::int64_t tb,
                                                 std::int64_t te) {
  std::vector<ring_key_tile> tiles;
  const std::int64_t tile = ring_tile_length(tb, te);
  for (std::int64_t t0 = tb; t0 < te; t0 += tile) {
    const std::int64_t kg = k0 + (t0 - tb), kq = kg - q0;
    if (kq > nq - 1) break;
    tiles.push_back({t0, te - t0 < tile ? te - t0 : tile, kg, kq});
  }
  return tiles;
}

// A tile's weights (or their gradient) in E, the operand of the products that read them: the
// scores' own memory where E is C, else scratch of the scores' size.
template <class Exec, class E, class CV>
Kokkos::View<E*, typename Exec::memory_space> ring_tile_operand(const CV& scores) {
  if constexpr (std::is_same_v<E, typename CV::value_type>)
    return scores;
  else
    return view_pool<E, typename Exec::memory_space>::get().allocate(scores.extent(0));
}

// Keys (at = 0) or values (at = the block's elements) of positions t0 .. t0 + tn of a block
// [kv_outer, nk, inner] held in `from` (the ring's message), as a contiguous [kv_outer, tn,
// inner] in E (the products' operand type): the message's own memory where the tile is the whole
// block and already in E, else gathered (and converted) into scratch.
template <class Exec, class E, class V>
Kokkos::View<E*, typename Exec::memory_space> ring_tile(const V& from, std::int64_t at, std::int64_t kv_outer,
                                                        std::int64_t nk, std::int64_t inner, std::int64_t t0,
                                                        std::int64_t tn) {
  using Mem = typename Exec::memory_space;
  using EView = Kokkos::View<E*, Mem>;
  if constexpr (std::is_same_v<typename V::value_type, E>)
    if (t0 == 0 && tn == nk) return EView(from.data() + at, static_cast<std::size_t>(kv_outer * nk * inner));
  const EView to = view_pool<E, Mem>::get().allocate(static_cast<std::size_t>(kv_outer * tn * inner));
  const std::int64_t per = tn * inner;
  kernels::parallel_for(
      "meshtensor::ring_attention_tile", kernels::range<Exec>(0, kv_outer * per), KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t ok = e / per, r = e % per;
        to(e) = static_cast<E>(from(at + (ok * nk + t0) * inner + r));
      });
  return to;
}

// x in C: x's own memory where its elements are C's, else a widened copy (scratch).
template <class Exec, class C, class V>
Kokkos::View<C*, typename Exec::memory_space> ring_in_compute_type(const V& x) {
  using Mem = typename Exec::memory_space;
  if constexpr (std::is_same_v<typename V::value_type, C>) {
    return Kokkos::View<C*, Mem>(x.data(), x.extent(0));
  } else {
    const auto to = view_pool<C, Mem>::get().allocate(x.extent(0));
    kernels::parallel_for(
        "meshtensor::ring_attention_widen", kernels::range<Exec>(0, static_cast<std::int64_t>(x.extent(0))),
        KOKKOS_LAMBDA(std::int64_t e) { to(e) = static_cast<C>(x(e)); });
    return to;
  }
}

// A plan's claim on ring_tile's scratch (planned_claim); none where the tile is the message's own
// memory, which the message's claim already counts.
template <class V, class CV>
std::shared_ptr<void> ring_tile_claim(const V& from, const CV& tile) {
  const auto* begin = reinterpret_cast<const char*>(from.data());
  const auto* at = reinterpret_cast<const char*>(tile.data());
  const bool inside = at >= begin && at < begin + from.extent(0) * sizeof(typename V::value_type);
  return inside ? nullptr : planned_claim(tile);
}

// Rows begin .. begin + count of each of `outer` runs of n rows of `inner` elements, as a contiguous
// [outer, count, inner] in a pool buffer (a query chunk's rows; scratch). Back: copy_rows_in.
template <class Exec, class CV>
CV ring_chunk_rows(const CV& x, std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t begin,
                   std::int64_t count) {
  const CV to = view_pool<typename CV::value_type, typename Exec::memory_space>::get().allocate(
      static_cast<std::size_t>(outer * count * inner));
  copy_rows_out<Exec>(x, outer, n, inner, begin, count, to);
  return to;
}

// A key bias in the ring: the whole bias [local batch, S] in C (every key's: the bias's layout
// does not split MemLength), read at the travelling block's global key positions; the rows of
// kv_outer are batch x `heads` (the local KV heads), so a row of the bias serves `heads` of them.
// values empty: no bias.
template <class CV>
struct ring_key_bias {
  CV values;
  std::int64_t length = 0, heads = 1;
  bool biased() const { return values.extent(0) > 0; }
};

// Forward, one block: q [kv_outer x group, nq, inner] (in E) at global positions q0.., keys and
// values kv = [k; v] (in E), each [kv_outer, nk, inner] at global positions k0..; m, l [kv_outer x group,
// nq] the running max and sum, acc (q's shape) the running sum of weights times values (rescaled
// as the max grows).
// Only the block's keys tb .. te (a chunk; 0 .. nk: all), at global positions k0.. . With a key
// bias (ring_key_bias), each score is (q . k + bias at the key's global position) * scale.
template <class Exec, class EV, class CV, class KV>
void ring_forward_block(const EV& q, const KV& kv, const CV& m, const CV& l, const CV& acc, std::int64_t kv_outer,
                        std::int64_t group, std::int64_t nq, std::int64_t nk, std::int64_t inner, std::int64_t q0,
                        std::int64_t k0, typename CV::value_type scale, std::int64_t tb, std::int64_t te,
                        const ring_key_bias<CV>& kb) {
  using C = typename CV::value_type;
  using E = typename EV::value_type;
  const CV bias = kb.values;
  const bool biased = kb.biased();
  const std::int64_t bias_len = kb.length, bias_heads = kb.heads;
  using Mem = typename Exec::memory_space;
  using CPool = view_pool<C, Mem>;
  const std::int64_t blk = kv_outer * nk * inner, gq = group * nq, rows = kv_outer * gq;
  const std::int64_t tile = ring_tile_length(tb, te);
  const CV scores = CPool::get().allocate(static_cast<std::size_t>(rows * tile));
  const EV weights = ring_tile_operand<Exec, E>(scores);
  const CV alpha = CPool::get().allocate(static_cast<std::size_t>(rows));
  const CV pv = CPool::get().allocate(static_cast<std::size_t>(rows * inner));
  // Counted in a plan while these buffers live (planned_claim; the weights once where they are the
  // scores' memory).
  const std::shared_ptr<void> claims[] = {planned_claim(scores), planned_claim(weights), planned_claim(alpha),
                                          planned_claim(pv)};
  for (const ring_key_tile& t : ring_key_tiles(nq, q0, k0, tb, te)) {
    const std::int64_t t0 = t.t0, tn = t.tn, kg = t.kg, kq = t.kq;
    const EV kt = ring_tile<Exec, E>(kv, 0, kv_outer, nk, inner, t0, tn);
    const EV vt = ring_tile<Exec, E>(kv, blk, kv_outer, nk, inner, t0, tn);
    const std::shared_ptr<void> tile_claims[] = {ring_tile_claim(kv, kt), ring_tile_claim(kv, vt)};
    const CV s(scores.data(), static_cast<std::size_t>(rows * tn));
    const EV w(weights.data(), static_cast<std::size_t>(rows * tn));  // s's memory where E is C
    kernels::product_to<Exec>(kv_outer, gq, tn, inner, false, true, q, kt, s);
    kernels::parallel_for(
        "meshtensor::ring_attention_forward", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t row) {
          const std::int64_t i = row % nq, sa = row * tn;
          const std::int64_t last = i - kq + 1 < tn ? i - kq + 1 : tn;  // keys at or before the query
          if (last <= 0) {
            for (std::int64_t t = 0; t < tn; ++t) w(sa + t) = E(0);
            alpha(row) = C(1);
            return;
          }
          // The row's bias: its sequence's (row / gq: the KV outer index, batch then KV heads).
          const std::int64_t ba = biased ? row / gq / bias_heads * bias_len + kg : 0;
          C tile_max = (s(sa) + (biased ? bias(ba) : C(0))) * scale;
          for (std::int64_t t = 1; t < last; ++t) {
            const C x = (s(sa + t) + (biased ? bias(ba + t) : C(0))) * scale;
            tile_max = x > tile_max ? x : tile_max;
          }
          const C m_old = m(row), m_new = m_old > tile_max ? m_old : tile_max;
          const C a = kmath::exp(m_old - m_new);  // 0 for the first tile (m_old the lowest value)
          C sum = l(row) * a;
          for (std::int64_t t = 0; t < last; ++t) {
            const C p = kmath::exp((s(sa + t) + (biased ? bias(ba + t) : C(0))) * scale - m_new);
            w(sa + t) = static_cast<E>(p);
            sum += p;
          }
          for (std::int64_t t = last; t < tn; ++t) w(sa + t) = E(0);
          m(row) = m_new;
          l(row) = sum;
          alpha(row) = a;
        });
    kernels::product_to<Exec>(kv_outer, gq, inner, tn, false, false, w, vt, pv);
    kernels::parallel_for(
        "meshtensor::ring_attention_forward_accumulate", kernels::range<Exec>(0, rows * inner),
        KOKKOS_LAMBDA(std::int64_t e) { acc(e) = acc(e) * alpha(e / inner) + pv(e); });
  }
}

// Backward, one block: dq [outer, nq, inner] += the block's contribution, and the block's dk, dv
// (in kv after k and v: [k; v; dk; dv], all in C; q and dO in E) += this processor's queries' contributions,
// summed over the group's query heads that share each key's head; from the weights P = exp(S
// scale - lse) and dS = P (dO . v - delta) scale, delta = dO . O per row. Per tile: S = q . k^T,
// dP = dO . v^T, the row kernel (P into S, dS into dP), then dq += dS . k, dk += dS^T . q, dv +=
// P^T . dO. No atomics: the products' sums come out the same on every run.
template <class Exec, class EV, class CV>
void ring_backward_block(const EV& q, const EV& dout, const CV& lse, const CV& delta, const CV& kv, const CV& dq,
                         std::int64_t kv_outer, std::int64_t group, std::int64_t nq, std::int64_t nk,
                         std::int64_t inner, std::int64_t q0, std::int64_t k0, typename CV::value_type scale,
                         std::int64_t tb, std::int64_t te, const ring_key_bias<CV>& kb) {
  using C = typename CV::value_type;
  using E = typename EV::value_type;
  const CV bias = kb.values;
  const bool biased = kb.biased();
  const std::int64_t bias_len = kb.length, bias_heads = kb.heads;
  using Mem = typename Exec::memory_space;
  using CPool = view_pool<C, Mem>;
  const std::int64_t blk = kv_outer * nk * inner, gq = group * nq, rows = kv_outer * gq;
  const std::int64_t tile = ring_tile_length(tb, te);
  const CV scores = CPool::get().allocate(static_cast<std::size_t>(rows * tile));
  const CV dscores = CPool::get().allocate(static_cast<std::size_t>(rows * tile));
  const EV weights = ring_tile_operand<Exec, E>(scores), dweights = ring_tile_operand<Exec, E>(dscores);
  const CV dq_tile = CPool::get().allocate(static_cast<std::size_t>(rows * inner));
  const CV dk_tile = CPool::get().allocate(static_cast<std::size_t>(kv_outer * tile * inner));
  const CV dv_tile = CPool::get().allocate(static_cast<std::size_t>(kv_outer * tile * inner));
  // Counted in a plan while these buffers live (planned_claim).
  const std::shared_ptr<void> claims[] = {planned_claim(scores),  planned_claim(dscores), planned_claim(weights),
                                          planned_claim(dweights), planned_claim(dq_tile), planned_claim(dk_tile),
                                          planned_claim(dv_tile)};
  for (const ring_key_tile& t : ring_key_tiles(nq, q0, k0, tb, te)) {
    const std::int64_t t0 = t.t0, tn = t.tn, kg = t.kg, kq = t.kq;
    const EV kt = ring_tile<Exec, E>(kv, 0, kv_outer, nk, inner, t0, tn);
    const EV vt = ring_tile<Exec, E>(kv, blk, kv_outer, nk, inner, t0, tn);
    const std::shared_ptr<void> tile_claims[] = {ring_tile_claim(kv, kt), ring_tile_claim(kv, vt)};
    const CV s(scores.data(), static_cast<std::size_t>(rows * tn)), ds(dscores.data(), static_cast<std::size_t>(rows * tn));
    // s's and ds's memory where E is C
    const EV w(weights.data(), static_cast<std::size_t>(rows * tn)), dw(dweights.data(), static_cast<std::size_t>(rows * tn));
    kernels::product_to<Exec>(kv_outer, gq, tn, inner, false, true, q, kt, s);
    kernels::product_to<Exec>(kv_outer, gq, tn, inner, false, true, dout, vt, ds);
    kernels::parallel_for(
        "meshtensor::ring_attention_backward", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t row) {
          const std::int64_t i = row % nq, sa = row * tn;
          std::int64_t last = i - kq + 1 < tn ? i - kq + 1 : tn;
          if (last < 0) last = 0;
          const C lr = lse(row), dr = delta(row);
          const std::int64_t ba = biased ? row / gq / bias_heads * bias_len + kg : 0;
          for (std::int64_t t = 0; t < last; ++t) {
            const C p = kmath::exp((s(sa + t) + (biased ? bias(ba + t) : C(0))) * scale - lr);
            const C dp = p * (ds(sa + t) - dr) * scale;
            w(sa + t) = static_cast<E>(p);
            dw(sa + t) = static_cast<E>(dp);
          }
          for (std::int64_t t = last; t < tn; ++t) {
            w(sa + t) = E(0);
            dw(sa + t) = E(0);
          }
        });
    const CV dkt(dk_tile.data(), static_cast<std::size_t>(kv_outer * tn * inner)),
        dvt(dv_tile.data(), static_cast<std::size_t>(kv_outer * tn * inner));
    kernels::product_to<Exec>(kv_outer, gq, inner, tn, false, false, dw, kt, dq_tile);
    kernels::product_to<Exec>(kv_outer, tn, inner, gq, true, false, dw, q, dkt);
    kernels::product_to<Exec>(kv_outer, tn, inner, gq, true, false, w, dout, dvt);
    kernels::parallel_for(
        "meshtensor::ring_attention_backward_dq", kernels::range<Exec>(0, rows * inner),
        KOKKOS_LAMBDA(std::int64_t e) { dq(e) += dq_tile(e); });
    const std::int64_t per = tn * inner;
    kernels::parallel_for(
        "meshtensor::ring_attention_backward_dkv", kernels::range<Exec>(0, kv_outer * per),
        KOKKOS_LAMBDA(std::int64_t e) {
          const std::int64_t at = (e / per * nk + t0) * inner + e % per;
          kv(2 * blk + at) += dkt(e);
          kv(3 * blk + at) += dvt(e);
        });
  }
}

// What the ring does around the blocks, element by element.

// delta(row) = the dot product of rows `row` of g and o (inner elements each), in C: the backward
// pass's row sums of dO * O.
template <class Exec, class TV, class CV>
void ring_row_dots(const TV& g, const TV& o, const CV& delta, std::int64_t rows, std::int64_t inner) {
  using C = typename CV::value_type;
  kernels::parallel_for(
      "meshtensor::ring_attention_delta", kernels::range<Exec>(0, rows), KOKKOS_LAMBDA(std::int64_t row) {
        C d = 0;
        for (std::int64_t e = 0; e < inner; ++e) d += static_cast<C>(g(row * inner + e)) * static_cast<C>(o(row * inner + e));
        delta(row) = d;
      });
}

// The backward pass's travelling message [k; v; dk; dv] of a block of n elements each: k and v in
// C, the sums zero.
template <class Exec, class TV, class CV>
void ring_pack_message(const TV& k, const TV& v, const CV& message, std::int64_t n) {
  using C = typename CV::value_type;
  kernels::parallel_for(
      "meshtensor::ring_attention_pack", kernels::range<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t e) {
        message(e) = static_cast<C>(k(e));
        message(n + e) = static_cast<C>(v(e));
        message(2 * n + e) = C(0);
        message(3 * n + e) = C(0);
      });
}

// to = from's first to.extent(0) elements in to's element type (the gradients back from C).
template <class Exec, class FromV, class ToV>
void ring_round_into(const FromV& from, const ToV& to, const char* name) {
  using T = typename ToV::value_type;
  kernels::parallel_for(name, kernels::range<Exec>(0, static_cast<std::int64_t>(to.extent(0))),
                        KOKKOS_LAMBDA(std::int64_t e) { to(e) = static_cast<T>(from(e)); });
}

// The forward pass's end for one chunk of query rows: o = acc / l and lse = m + log(l). Chunk row
// (h, i) of heads_rows x n is row (h, b + i) of the part's nq.
template <class Exec, class CV, class TV>
void ring_finish_rows(const CV& m, const CV& l, const CV& acc, const TV& out, const CV& lse, std::int64_t heads_rows,
                      std::int64_t n, std::int64_t nq, std::int64_t b, std::int64_t inner) {
  using C = typename CV::value_type;
  using T = typename TV::value_type;
  kernels::parallel_for(
      "meshtensor::ring_attention_finish", kernels::range<Exec>(0, heads_rows * n), KOKKOS_LAMBDA(std::int64_t row) {
        const std::int64_t to = row / n * nq + b + row % n;
        const C sum = l(row);
        for (std::int64_t d = 0; d < inner; ++d) out(to * inner + d) = static_cast<T>(acc(row * inner + d) / sum);
        lse(to) = m(row) + kmath::log(sum);
      });
}

}  // namespace meshtensor::detail
