// Context parallelism by a ring (nn::ring_causal_attention): with the sequence split over mesh axes
// (alone, over two axes in either order, with data parallelism, with tensor parallelism over the
// heads), the result equals causal_attention's on the whole sequence and all-to-all attention's,
// uneven lengths included; the shifts counted forward (P - 1) and backward (P), calls and bytes,
// are the plan's and the header's formula, and a planned run counts what the real one sends;
// gradients through x and every weight equal central differences. The same for grouped-query
// attention (nn::ring_grouped_causal_attention) against grouped_causal_attention and the all-to-all
// one, with the KV heads or the group split over the other axis; its k, v blocks are counted at
// the KV heads; with rope, it equals grouped_causal_attention's rope form (split, uneven, zigzag
// positions). Blocks longer than the kernels' tile of keys (several tiles, uneven) give the same
// result and gradients as the whole sequence's attention. With a padding (key) bias, the ring
// equals causal_attention with it (split, zigzag, uneven; the plan and bytes the ring's without
// one); a transformer block with ring attention and residual dropout equals the replicated block;
// in bf16 (x and weights) the result and every gradient are the float one's within bf16's
// stated tolerance.
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/nn/context_attention.hpp>
#include <meshtensor/nn/ring_attention.hpp>
#include <test_support.hpp>

#include "comm_counts.hpp"
#include "transformer_dims.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
constexpr std::int64_t B = 2, M = 6, H = 4, K = 3;

template <class X, class Mesh, class Fn>
void check_grad(const Mesh& g, const typename X::extents_type& ext, std::uint64_t seed, Fn loss_of, std::size_t stride) {
  check_gradient<X>(g, ext, mt::gather_all(mt::random_uniform<X>(g, ext, seed, -1.0, 1.0)), loss_of,
                    {.h = 1e-6, .tol = 1e-6, .stride = stride});
}

// The bytes this processor's ring sends, by the header's formula: a block of part p is
// outer x |part p| x |DKv| elements (outer: the local batch times the local heads); forward the k
// and v of the blocks of parts me, me - 1, ..., me - P + 2; backward those with their dk and dv,
// then the dk and dv of part me + 1 home.
struct ring_bytes {
  std::int64_t forward = 0, backward = 0;
};
template <class X>
ring_bytes ring_bytes_of(const X& x, std::int64_t local_heads) {
  const auto pl = x.placement();
  constexpr std::size_t d = X::template index_of<length>();
  const std::int64_t P = pl.parts(d);
  const std::int64_t me = pl.part_at(d, x.mesh().communicator().coords());
  const auto block = [&](std::int64_t p) {
    return x.template local_extent<batch>() * local_heads * pl.part_extent(d, ((p % P) + P) % P) * K *
           static_cast<std::int64_t>(sizeof(double));
  };
  ring_bytes r;
  for (std::int64_t s = 0; s + 1 < P; ++s) {
    r.forward += 2 * block(me - s);
    r.backward += 4 * block(me - s);
  }
  if (P > 1) r.backward += 2 * block(me + 1);
  return r;
}
}  // namespace

TEST_CASE("ring attention equals causal attention on the whole sequence", "[gradient]") {
  // The sequence over both axes (in mesh order, and reversed: parts then differ from the
  // sub-communicator's ranks); with batch over one (data); with the heads over one (tensor).
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LR = mt::layout<grid, mt::split<length, c_, r_>>;
  using LB = mt::layout<grid, mt::split<batch, r_>, mt::split<length, c_>>;
  using LC = mt::layout<grid, mt::split<heads, r_>, mt::split<length, c_>>;
  // The zigzag placement (two chunks per part, the ring's blocks computed chunk pair by chunk
  // pair): over both axes, and with the heads over one.
  using LZ = mt::layout<grid, mt::zigzag<length, r_, c_>>;
  using LZC = mt::layout<grid, mt::split<heads, r_>, mt::zigzag<length, c_>>;
  using L0 = mt::layout<grid>;
  const auto g = world_grid();
  // 7: uneven over 2, 3 and 4 parts; 3: an empty part at 4 (its blocks are empty, still passed on).
  const auto S = GENERATE(std::int64_t{8}, std::int64_t{7}, std::int64_t{3});
  for_each_type(list<LA, LR, LB, LC, LZ, LZC>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", length " << S << ", rank " << g.rank());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WO = mt::tensor<double, L, heads, d_kv, d_model>;
    using X0 = mt::tensor<double, L0, batch, length, d_model>;
    using W0 = mt::tensor<double, L0, d_model, heads, d_kv>;
    using WO0 = mt::tensor<double, L0, heads, d_kv, d_model>;
    const typename X::extents_type ex{B, S, M};
    const typename W::extents_type ew{M, H, K};
    auto wq = mt::random_normal<W>(g, ew, 31, 0, 0.5), wk = mt::random_normal<W>(g, ew, 32, 0, 0.5),
         wv = mt::random_normal<W>(g, ew, 33, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {H, K, M}, 34, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 35);
    const auto att = [](const X& x, const W& q, const W& k, const W& v, const WO& o) {
      return nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(x, q, k, v, o);
    };
    const auto whole = nn::causal_attention<length, mlen, d_model, heads, d_kv>(
        mt::from_host<X0>(g, ex, mt::gather_all(x0)), mt::from_host<W0>(g, ew, mt::gather_all(wq)),
        mt::from_host<W0>(g, ew, mt::gather_all(wk)), mt::from_host<W0>(g, ew, mt::gather_all(wv)),
        mt::from_host<WO0>(g, {H, K, M}, mt::gather_all(wo)));
    g.reset_counters();
    const auto split = att(x0, wq, wk, wv, wo);
    const auto counted = g.counters();
    REQUIRE(max_rel_error(mt::gather_all(split), mt::gather_all(whole)) < 1e-12);
    REQUIRE(max_rel_error(mt::gather_all(split), mt::gather_all(nn::all_to_all_causal_attention<length, mlen, d_model,
                                                                                               heads, d_kv>(
                                                     x0, wq, wk, wv, wo))) < 1e-12);

    // P - 1 shifts over the sequence's axes (none on one part); the heads' allreduce over their own
    // axes (LC) at the output projection. The ring's plan says the shifts.
    const auto seq = typename L::template axes_of<length>{};
    const unsigned seq_mask = [&]<class... As>(mt::type_list<As...>) { return grid::template mask<As...>(); }(seq);
    const std::int64_t P = x0.placement().parts(X::template index_of<length>());
    mt::comm_counters want = mt::ring_attention_plan(mt::axis_set(seq_mask), P).as_counts();
    if (P > 1) REQUIRE(want[{mt::collective::shift, mt::axis_set(seq_mask)}].calls == P - 1);
    if constexpr (std::is_same_v<L, LC> || std::is_same_v<L, LZC>) want[{mt::collective::allreduce, mt::axis_set(grid::template mask<r_>())}].calls = 1;
    require_counts(counted, want);
    const ring_bytes bytes = ring_bytes_of(x0, wq.template local_extent<heads>());
    const auto shifts = [&](const mt::comm_counters& c) {
      const auto it = c.find({mt::collective::shift, mt::axis_set(seq_mask)});
      return it == c.end() ? mt::comm_count{} : it->second;
    };
    CHECK(shifts(counted).bytes == bytes.forward);
    // The header's estimate says the same, before any run.
    const auto estimate = [&] {
      const auto pl = x0.placement();
      constexpr std::size_t d = X::template index_of<length>();
      std::vector<std::int64_t> extents;
      for (std::int64_t p = 0; p < P; ++p) extents.push_back(pl.part_extent(d, p));
      return mt::ring_attention_traffic_of(extents, static_cast<int>(pl.part_at(d, g.communicator().coords())),
                                           x0.template local_extent<batch>() * wq.template local_extent<heads>() * K,
                                           sizeof(double), sizeof(double));
    }();
    CHECK(estimate.forward_calls == (P > 1 ? P - 1 : 0));
    CHECK(estimate.forward_bytes == bytes.forward);
    CHECK(estimate.backward_calls == (P > 1 ? P : 0));
    CHECK(estimate.backward_bytes == bytes.backward);

    // Backward: P shifts (the ring again, then dk and dv home), as the backward plan says.
    {
      auto x = x0;
      x.requires_grad();
      const auto loss = weighted_sum(att(x, wq, wk, wv, wo), 2);
      g.reset_counters();
      (void)mt::gradient(loss, x);
      const auto back = shifts(g.counters());
      const auto plan = mt::ring_attention_backward_plan(mt::axis_set(seq_mask), P).as_counts();
      const auto planned_calls = plan.empty() ? 0 : plan.begin()->second.calls;
      CHECK(back.calls == planned_calls);
      CHECK(back.calls == (P > 1 ? P : 0));
      CHECK(back.bytes == bytes.backward);
    }

    // A planned run of the same step (forward and backward, every weight's gradient) counts what
    // the real one sends: calls and bytes of every collective.
    const auto step = [&](const grid& m) {
      auto x = mt::random_normal<X>(m, ex, 35);
      auto q = mt::random_normal<W>(m, ew, 31, 0, 0.5), k = mt::random_normal<W>(m, ew, 32, 0, 0.5),
           v = mt::random_normal<W>(m, ew, 33, 0, 0.5);
      auto o = mt::random_normal<WO>(m, {H, K, M}, 34, 0, 0.5);
      x.requires_grad(), q.requires_grad(), k.requires_grad(), v.requires_grad(), o.requires_grad();
      m.reset_counters();
      const auto loss = weighted_sum(att(x, q, k, v, o), 2);
      (void)mt::gradient(loss, x, q, k, v, o);
      return m.counters();
    };
    const auto real = step(g);
    const auto planned = [&] {  // in a scope of its own: no real tensor is made while it exists
      const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
      return step(pm);
    }();
    INFO("real: " << show(real) << "\nplanned: " << show(planned));
    CHECK(planned == real);
    CHECK(shifts(real).calls == (P > 1 ? 2 * P - 1 : 0));
    CHECK(shifts(real).bytes == bytes.forward + bytes.backward);

    if (S == 7) {
      check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(att(x, wq, wk, wv, wo), 2); }, 5);
      check_grad<W>(g, ew, 3, [&](const W& w) { return weighted_sum(att(x0, w, wk, wv, wo), 2); }, 4);
      check_grad<W>(g, ew, 4, [&](const W& w) { return weighted_sum(att(x0, wq, w, wv, wo), 2); }, 4);
      check_grad<W>(g, ew, 5,
                    [&](const W& w) { return weighted_sum(att(x0, wq, wk, w, wo), 2); }, 4);
      check_grad<WO>(g, {H, K, M}, 6, [&](const WO& w) { return weighted_sum(att(x0, wq, wk, wv, w), 2); }, 4);
    }
  });
}

TEST_CASE("ring grouped-query attention equals grouped_causal_attention", "[gradient]") {
  // The sequence over both axes; with batch over one (data); with the KV heads over one, or the
  // group (query heads) over one (tensor: then k and v are replicated there, and dk, dv summed).
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LB = mt::layout<grid, mt::split<batch, r_>, mt::split<length, c_>>;
  using LK = mt::layout<grid, mt::split<kv_heads, r_>, mt::split<length, c_>>;
  using LG = mt::layout<grid, mt::split<group, r_>, mt::split<length, c_>>;
  using LZ = mt::layout<grid, mt::zigzag<length, r_, c_>>;
  using L0 = mt::layout<grid>;
  constexpr std::int64_t KV = 2, G = 2;
  const auto g = world_grid();
  const auto S = GENERATE(std::int64_t{8}, std::int64_t{7});
  for_each_type(list<LA, LB, LK, LG, LZ>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", length " << S << ", rank " << g.rank());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using WQ = mt::tensor<double, L, d_model, kv_heads, group, d_kv>;
    using WK = mt::tensor<double, L, d_model, kv_heads, d_kv>;
    using WO = mt::tensor<double, L, kv_heads, group, d_kv, d_model>;
    using X0 = mt::tensor<double, L0, batch, length, d_model>;
    using WQ0 = mt::tensor<double, L0, d_model, kv_heads, group, d_kv>;
    using WK0 = mt::tensor<double, L0, d_model, kv_heads, d_kv>;
    using WO0 = mt::tensor<double, L0, kv_heads, group, d_kv, d_model>;
    const typename X::extents_type ex{B, S, M};
    const typename WQ::extents_type eq{M, KV, G, K};
    const typename WK::extents_type ek{M, KV, K};
    const typename WO::extents_type eo{KV, G, K, M};
    auto wq = mt::random_normal<WQ>(g, eq, 41, 0, 0.5);
    auto wk = mt::random_normal<WK>(g, ek, 42, 0, 0.5), wv = mt::random_normal<WK>(g, ek, 43, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, eo, 44, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 45);
    const auto att = [](const X& x, const WQ& q, const WK& k, const WK& v, const WO& o) {
      return nn::ring_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x, q, k, v, o);
    };
    const auto whole = nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(
        mt::from_host<X0>(g, ex, mt::gather_all(x0)), mt::from_host<WQ0>(g, eq, mt::gather_all(wq)),
        mt::from_host<WK0>(g, ek, mt::gather_all(wk)), mt::from_host<WK0>(g, ek, mt::gather_all(wv)),
        mt::from_host<WO0>(g, eo, mt::gather_all(wo)));
    g.reset_counters();
    const auto split = att(x0, wq, wk, wv, wo);
    const auto counted = g.counters();
    REQUIRE(max_rel_error(mt::gather_all(split), mt::gather_all(whole)) < 1e-12);
    REQUIRE(max_rel_error(mt::gather_all(split),
                          mt::gather_all(nn::all_to_all_grouped_causal_attention<length, mlen, d_model, kv_heads, group,
                                                                                 d_kv>(x0, wq, wk, wv, wo))) < 1e-12);
    {
      // With rope (d_kv even): q and k rotated at their global positions (split, uneven, zigzag)
      // before the ring, as grouped_causal_attention's rope form on one processor.
      constexpr std::int64_t RK = 4;
      const nn::rope_config rope{.theta = 20.0, .position_offset = 1};
      auto rq = mt::random_normal<WQ>(g, {M, KV, G, RK}, 46, 0, 0.5);
      auto rk = mt::random_normal<WK>(g, {M, KV, RK}, 47, 0, 0.5), rv = mt::random_normal<WK>(g, {M, KV, RK}, 48, 0, 0.5);
      auto ro = mt::random_normal<WO>(g, {KV, G, RK, M}, 49, 0, 0.5);
      const auto rotated = mt::gather_all(nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(
          mt::from_host<X0>(g, ex, mt::gather_all(x0)), mt::from_host<WQ0>(g, {M, KV, G, RK}, mt::gather_all(rq)),
          mt::from_host<WK0>(g, {M, KV, RK}, mt::gather_all(rk)), mt::from_host<WK0>(g, {M, KV, RK}, mt::gather_all(rv)),
          mt::from_host<WO0>(g, {KV, G, RK, M}, mt::gather_all(ro)), rope));
      REQUIRE(max_rel_error(mt::gather_all(nn::ring_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(
                                x0, rq, rk, rv, ro, rope)),
                            rotated) < 1e-12);
      REQUIRE(max_rel_error(mt::gather_all(att(x0, rq, rk, rv, ro)), rotated) > 1e-3);
    }

    // P - 1 shifts over the sequence's axes; the heads' allreduce over r_ (LK, LG) at the output
    // projection.
    const auto seq = typename L::template axes_of<length>{};
    const unsigned seq_mask = [&]<class... As>(mt::type_list<As...>) { return grid::template mask<As...>(); }(seq);
    const std::int64_t P = x0.placement().parts(X::template index_of<length>());
    constexpr bool group_split = std::is_same_v<L, LG>;
    const mt::axis_set r_axes(grid::template mask<r_>());
    mt::comm_counters want = mt::ring_attention_plan(mt::axis_set(seq_mask), P).as_counts();
    if constexpr (std::is_same_v<L, LK> || group_split) want[{mt::collective::allreduce, r_axes}].calls = 1;
    require_counts(counted, want);
    // The blocks that travel are k's and v's at the local KV heads: Group times fewer bytes than
    // blocks of q's heads.
    const ring_bytes bytes = ring_bytes_of(x0, wk.template local_extent<kv_heads>());
    const auto count_of = [&](const mt::comm_counters& c, mt::collective kind, mt::axis_set axes) {
      const auto it = c.find({kind, axes});
      return it == c.end() ? mt::comm_count{} : it->second;
    };
    const auto shifts = [&](const mt::comm_counters& c) { return count_of(c, mt::collective::shift, mt::axis_set(seq_mask)); };
    CHECK(shifts(counted).bytes == bytes.forward);
    const auto estimate = [&] {
      const auto pl = x0.placement();
      constexpr std::size_t d = X::template index_of<length>();
      std::vector<std::int64_t> extents;
      for (std::int64_t p = 0; p < P; ++p) extents.push_back(pl.part_extent(d, p));
      return mt::ring_attention_traffic_of(extents, static_cast<int>(pl.part_at(d, g.communicator().coords())),
                                           x0.template local_extent<batch>() * wk.template local_extent<kv_heads>() * K,
                                           sizeof(double), sizeof(double), group_split);
    }();
    CHECK(estimate.forward_calls == (P > 1 ? P - 1 : 0));
    CHECK(estimate.forward_bytes == bytes.forward);
    CHECK(estimate.backward_calls == (P > 1 ? P : 0));
    CHECK(estimate.backward_bytes == bytes.backward);

    // Backward: P shifts, as the backward plan says; under LG the plan's allreduce of dk and dv
    // over r_ (the group's axis), besides the one of x's gradient through q's projection.
    {
      auto x = x0;
      x.requires_grad();
      const auto loss = weighted_sum(att(x, wq, wk, wv, wo), 2);
      g.reset_counters();
      (void)mt::gradient(loss, x);
      const auto back = g.counters();
      const auto plan = mt::ring_attention_backward_plan(mt::axis_set(seq_mask), P,
                                                         group_split ? r_axes : mt::axis_set{}).as_counts();
      CHECK(shifts(back).calls == count_of(plan, mt::collective::shift, mt::axis_set(seq_mask)).calls);
      CHECK(shifts(back).calls == (P > 1 ? P : 0));
      CHECK(shifts(back).bytes == bytes.backward);
      const std::int64_t dx_bytes = x0.template local_extent<batch>() * x0.template local_extent<length>() * M *
                                    static_cast<std::int64_t>(sizeof(double));
      INFO("backward: " << show(back));
      if constexpr (group_split) {
        CHECK(count_of(plan, mt::collective::allreduce, r_axes).calls == 1);
        CHECK(estimate.group_allreduce_calls == 1);
        CHECK(count_of(back, mt::collective::allreduce, r_axes).calls == 2);
        CHECK(count_of(back, mt::collective::allreduce, r_axes).bytes == estimate.group_allreduce_bytes + dx_bytes);
      } else {
        CHECK(plan.count({mt::collective::allreduce, r_axes}) == 0);
        CHECK(estimate.group_allreduce_calls == 0);
      }
    }

    // A planned run of the same step counts what the real one sends.
    const auto step = [&](const grid& m) {
      auto x = mt::random_normal<X>(m, ex, 45);
      auto q = mt::random_normal<WQ>(m, eq, 41, 0, 0.5);
      auto k = mt::random_normal<WK>(m, ek, 42, 0, 0.5), v = mt::random_normal<WK>(m, ek, 43, 0, 0.5);
      auto o = mt::random_normal<WO>(m, eo, 44, 0, 0.5);
      x.requires_grad(), q.requires_grad(), k.requires_grad(), v.requires_grad(), o.requires_grad();
      m.reset_counters();
      const auto loss = weighted_sum(att(x, q, k, v, o), 2);
      (void)mt::gradient(loss, x, q, k, v, o);
      return m.counters();
    };
    const auto real = step(g);
    const auto planned = [&] {
      const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
      return step(pm);
    }();
    INFO("real: " << show(real) << "\nplanned: " << show(planned));
    CHECK(planned == real);
    CHECK(shifts(real).calls == (P > 1 ? 2 * P - 1 : 0));
    CHECK(shifts(real).bytes == bytes.forward + bytes.backward);

    if (S == 7) {
      check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(att(x, wq, wk, wv, wo), 2); }, 5);
      check_grad<WQ>(g, eq, 3, [&](const WQ& w) { return weighted_sum(att(x0, w, wk, wv, wo), 2); }, 4);
      check_grad<WK>(g, ek, 4, [&](const WK& w) { return weighted_sum(att(x0, wq, w, wv, wo), 2); }, 3);
      check_grad<WK>(g, ek, 5, [&](const WK& w) { return weighted_sum(att(x0, wq, wk, w, wo), 2); }, 3);
      check_grad<WO>(g, eo, 6, [&](const WO& w) { return weighted_sum(att(x0, wq, wk, wv, w), 2); }, 4);
    }
  });
}

namespace {
// The tensors of ring attention's bias test, multi-head (Grouped false: heads) or grouped-query
// (kv_heads and group), under layout Lx.
template <bool Grouped, class Lx>
struct biased_types {
  using X = mt::tensor<double, Lx, batch, length, d_model>;
  using WQ = std::conditional_t<Grouped, mt::tensor<double, Lx, d_model, kv_heads, group, d_kv>,
                                mt::tensor<double, Lx, d_model, heads, d_kv>>;
  using WK = std::conditional_t<Grouped, mt::tensor<double, Lx, d_model, kv_heads, d_kv>,
                                mt::tensor<double, Lx, d_model, heads, d_kv>>;
  using WO = std::conditional_t<Grouped, mt::tensor<double, Lx, kv_heads, group, d_kv, d_model>,
                                mt::tensor<double, Lx, heads, d_kv, d_model>>;
  using Ids = mt::tensor<double, Lx, batch, length>;
  using KB = mt::tensor<double, Lx, batch, mlen>;  // every key's bias: MemLength not split
  static typename WQ::extents_type eq() {
    if constexpr (Grouped) return {M, 2, 2, K};
    else return {M, H, K};
  }
  static typename WK::extents_type ek() {
    if constexpr (Grouped) return {M, 2, K};
    else return {M, H, K};
  }
  static typename WO::extents_type eo() {
    if constexpr (Grouped) return {2, 2, K, M};
    else return {H, K, M};
  }
  template <class... A>
  static X ring(const A&... a) {
    if constexpr (Grouped) return nn::ring_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(a...);
    else return nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(a...);
  }
  template <class... A>
  static auto whole(const A&... a) {
    if constexpr (Grouped) return nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(a...);
    else return nn::causal_attention<length, mlen, d_model, heads, d_kv>(a...);
  }
  template <class W>
  static std::int64_t local_kv_heads(const W& wk) {
    if constexpr (Grouped) return wk.template local_extent<kv_heads>();
    else return wk.template local_extent<heads>();
  }
};

// Token ids of B = 2 sequences of S positions (0: padding): the first padded at its end (its last
// two positions), the second with one key in the middle padded; key 0 of each is real, so no
// query has every key masked.
std::vector<double> padded_ids(std::int64_t S) {
  std::vector<double> ids(static_cast<std::size_t>(B * S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < S; ++t) {
      const bool pad = t > 0 && (b == 0 ? t >= S - 2 : t == S / 2);
      ids[static_cast<std::size_t>(b * S + t)] = pad ? 0.0 : static_cast<double>(1 + t);
    }
  return ids;
}

// The ring with key_bias = padding_bias(ids) + a small random bias per key (so that the bias's
// positions and its place before the scale matter for every key, not only the padded ones'),
// against the unsplit causal attention with the same bias: the result and the gradients through x
// and every weight; the collectives those of the ring without a bias (the bias does not travel),
// the shifts' bytes the header's formula, and a planned run counts what the real one sends.
template <bool Grouped, class L>
void check_ring_bias(const grid& g, std::int64_t S, bool heads_split) {
  using T = biased_types<Grouped, L>;
  using T0 = biased_types<Grouped, mt::layout<grid>>;
  using X = typename T::X;
  const typename X::extents_type ex{B, S, M};
  const auto eq = T::eq();
  const auto ek = T::ek();
  const auto eo = T::eo();
  auto x = mt::random_normal<X>(g, ex, 85);
  auto wq = mt::random_normal<typename T::WQ>(g, eq, 81, 0, 0.5);
  auto wk = mt::random_normal<typename T::WK>(g, ek, 82, 0, 0.5), wv = mt::random_normal<typename T::WK>(g, ek, 83, 0, 0.5);
  auto wo = mt::random_normal<typename T::WO>(g, eo, 84, 0, 0.5);
  const auto ids = mt::from_host<typename T::Ids>(g, {B, S}, padded_ids(S));
  const typename T::KB bias(nn::padding_bias<length, mlen>(ids, 0.0) +
                            mt::random_uniform<typename T::KB>(g, {B, S}, 86, -0.5, 0.5));
  auto x1 = mt::from_host<typename T0::X>(g, ex, mt::gather_all(x));
  auto wq1 = mt::from_host<typename T0::WQ>(g, eq, mt::gather_all(wq));
  auto wk1 = mt::from_host<typename T0::WK>(g, ek, mt::gather_all(wk)),
       wv1 = mt::from_host<typename T0::WK>(g, ek, mt::gather_all(wv));
  auto wo1 = mt::from_host<typename T0::WO>(g, eo, mt::gather_all(wo));
  const auto bias1 = mt::from_host<typename T0::KB>(g, {B, S}, mt::gather_all(bias));
  x.requires_grad(), wq.requires_grad(), wk.requires_grad(), wv.requires_grad(), wo.requires_grad();
  x1.requires_grad(), wq1.requires_grad(), wk1.requires_grad(), wv1.requires_grad(), wo1.requires_grad();

  g.reset_counters();
  const auto split = T::ring(x, wq, wk, wv, wo, bias);
  const auto counted = g.counters();
  const auto whole = T0::whole(x1, wq1, wk1, wv1, wo1, bias1);
  REQUIRE(max_rel_error(mt::gather_all(split), mt::gather_all(whole)) < 1e-12);
  // The bias matters: without it the result differs (the test's padding and bias are not no-ops).
  REQUIRE(max_rel_error(mt::gather_all(T0::whole(x1, wq1, wk1, wv1, wo1)), mt::gather_all(whole)) > 1e-3);

  // The ring's collectives, as without a bias: P - 1 shifts, of the formula's bytes.
  const unsigned seq_mask = [&]<class... As>(mt::type_list<As...>) {
    return grid::template mask<As...>();
  }(typename L::template axes_of<length>{});
  const mt::axis_set seq(seq_mask);
  const std::int64_t P = x.placement().parts(X::template index_of<length>());
  mt::comm_counters want = mt::ring_attention_plan(seq, P).as_counts();
  if (heads_split) want[{mt::collective::allreduce, mt::axis_set(grid::template mask<r_>())}].calls = 1;
  require_counts(counted, want);
  const ring_bytes bytes = ring_bytes_of(x, T::local_kv_heads(wk));
  const auto shifts = [&](const mt::comm_counters& c) {
    const auto it = c.find({mt::collective::shift, seq});
    return it == c.end() ? mt::comm_count{} : it->second;
  };
  CHECK(shifts(counted).bytes == bytes.forward);

  // Gradients through x and every weight equal the unsplit attention's (its autodiff), and the
  // backward pass's shifts are the backward plan's.
  const auto loss = weighted_sum(split, 2);
  g.reset_counters();
  const auto [gx, gq, gk, gv, go] = mt::gradient(loss, x, wq, wk, wv, wo);
  const auto back = shifts(g.counters());
  const auto [gx1, gq1, gk1, gv1, go1] = mt::gradient(weighted_sum(whole, 2), x1, wq1, wk1, wv1, wo1);
  CHECK(max_rel_error(mt::gather_all(gx), mt::gather_all(gx1)) < 1e-10);
  CHECK(max_rel_error(mt::gather_all(gq), mt::gather_all(gq1)) < 1e-10);
  CHECK(max_rel_error(mt::gather_all(gk), mt::gather_all(gk1)) < 1e-10);
  CHECK(max_rel_error(mt::gather_all(gv), mt::gather_all(gv1)) < 1e-10);
  CHECK(max_rel_error(mt::gather_all(go), mt::gather_all(go1)) < 1e-10);
  const auto back_plan = mt::ring_attention_backward_plan(seq, P).as_counts();
  const auto it = back_plan.find({mt::collective::shift, seq});
  CHECK(back.calls == (it == back_plan.end() ? 0 : it->second.calls));
  CHECK(back.bytes == bytes.backward);

  // A planned run of the step (forward and backward, every gradient) counts what the real one
  // sends, calls and bytes.
  const auto step = [&](const grid& m) {
    auto x = mt::random_normal<X>(m, ex, 85);
    auto q = mt::random_normal<typename T::WQ>(m, eq, 81, 0, 0.5);
    auto k = mt::random_normal<typename T::WK>(m, ek, 82, 0, 0.5), v = mt::random_normal<typename T::WK>(m, ek, 83, 0, 0.5);
    auto o = mt::random_normal<typename T::WO>(m, eo, 84, 0, 0.5);
    const auto b = mt::random_uniform<typename T::KB>(m, {B, S}, 86, -0.5, 0.5);
    x.requires_grad(), q.requires_grad(), k.requires_grad(), v.requires_grad(), o.requires_grad();
    m.reset_counters();
    const auto loss = weighted_sum(T::ring(x, q, k, v, o, b), 2);
    (void)mt::gradient(loss, x, q, k, v, o);
    return m.counters();
  };
  const auto real = step(g);
  const auto planned = [&] {
    const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
    return step(pm);
  }();
  INFO("real: " << show(real) << "\nplanned: " << show(planned));
  CHECK(planned == real);
  CHECK(shifts(real).bytes == bytes.forward + bytes.backward);
}
}  // namespace

TEST_CASE("ring attention with a padding bias equals causal attention with it", "[gradient]") {
  // The sequence split over both axes, contiguous or zigzag; with the batch over one (the bias's
  // rows split alike); with the heads (multi-head) or the KV heads or the group (grouped-query)
  // over one. Lengths even, uneven (7) and with an empty part at 4 ranks (3).
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LB = mt::layout<grid, mt::split<batch, r_>, mt::split<length, c_>>;
  using LC = mt::layout<grid, mt::split<heads, r_>, mt::split<length, c_>>;
  using LZ = mt::layout<grid, mt::zigzag<length, r_, c_>>;
  using LZB = mt::layout<grid, mt::split<batch, r_>, mt::zigzag<length, c_>>;
  using LZC = mt::layout<grid, mt::split<heads, r_>, mt::zigzag<length, c_>>;
  using LK = mt::layout<grid, mt::split<kv_heads, r_>, mt::zigzag<length, c_>>;
  using LG = mt::layout<grid, mt::split<group, r_>, mt::split<length, c_>>;
  const auto g = world_grid();
  const auto S = GENERATE(std::int64_t{8}, std::int64_t{7}, std::int64_t{3});
  for_each_type(list<LA, LB, LC, LZ, LZB, LZC>{}, [&]<class L>() {
    INFO("multi-head, " << layout_name<L>() << ", length " << S << ", rank " << g.rank());
    check_ring_bias<false, L>(g, S, std::is_same_v<L, LC> || std::is_same_v<L, LZC>);
  });
  for_each_type(list<LA, LZ, LK, LG>{}, [&]<class L>() {
    INFO("grouped-query, " << layout_name<L>() << ", length " << S << ", rank " << g.rank());
    check_ring_bias<true, L>(g, S, std::is_same_v<L, LK> || std::is_same_v<L, LG>);
  });
}

TEST_CASE("ring attention refuses a key bias of other extents than x's, or on the tape", "[gradient]") {
  using L = mt::layout<grid, mt::split<length, r_, c_>>;
  using T = biased_types<false, L>;
  const auto g = world_grid();
  const std::int64_t S = 8;
  const auto x = mt::random_normal<typename T::X>(g, {B, S, M}, 85);
  const auto wq = mt::random_normal<typename T::WQ>(g, T::eq(), 81, 0, 0.5);
  const auto wo = mt::random_normal<typename T::WO>(g, T::eo(), 84, 0, 0.5);
  const auto refusal = [&](const typename T::KB& bias) {
    try {
      (void)T::ring(x, wq, wq, wq, wo, bias);
    } catch (const mt::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");  // what the checks below then fail on
  };
  const auto longer = refusal(mt::random_uniform<typename T::KB>(g, {B, S + 1}, 86, -0.5, 0.5));
  CHECK_THAT(longer, Catch::Matchers::ContainsSubstring("along 'memory_length'") && Catch::Matchers::ContainsSubstring("extent 9") &&
                         Catch::Matchers::ContainsSubstring("has 8"));
  const auto wider = refusal(mt::random_uniform<typename T::KB>(g, {B + 1, S}, 86, -0.5, 0.5));
  CHECK_THAT(wider, Catch::Matchers::ContainsSubstring("along 'batch'"));
  auto tracked = mt::random_uniform<typename T::KB>(g, {B, S}, 86, -0.5, 0.5);
  tracked.requires_grad();
  CHECK_THAT(refusal(tracked), Catch::Matchers::ContainsSubstring("on the tape"));
}

TEST_CASE("ring attention takes long blocks in tiles of keys", "[gradient]") {
  // Parts longer than the kernels' tile (512 keys) and of uneven lengths: 2309 positions give
  // blocks of 5, 3, 2 and 2 tiles at 1, 2, 3 and 4 parts, the last tile short, the diagonal
  // block's later tiles partly or wholly in the future. Grouped-query attention (the group's query
  // heads share each product), the sequence over both axes or with the KV heads over one: the
  // result and the gradients through x and every weight equal grouped_causal_attention's on the
  // whole sequence with the same key bias (its autodiff: central differences over 2309 positions
  // would be slow).
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LK = mt::layout<grid, mt::split<kv_heads, r_>, mt::split<length, c_>>;
  using LZ = mt::layout<grid, mt::zigzag<length, r_, c_>>;  // chunks of several tiles
  using L0 = mt::layout<grid>;
  constexpr std::int64_t KV = 2, G = 2, S = 2309;
  const auto g = world_grid();
  using X0 = mt::tensor<double, L0, batch, length, d_model>;
  using WQ0 = mt::tensor<double, L0, d_model, kv_heads, group, d_kv>;
  using WK0 = mt::tensor<double, L0, d_model, kv_heads, d_kv>;
  using WO0 = mt::tensor<double, L0, kv_heads, group, d_kv, d_model>;
  using B0 = mt::tensor<double, L0, batch, mlen>;
  const typename X0::extents_type ex{1, S, M};  // one sequence: the whole one's scores are S x S
  const typename WQ0::extents_type eq{M, KV, G, K};
  const typename WK0::extents_type ek{M, KV, K};
  const typename WO0::extents_type eo{KV, G, K, M};
  // The whole sequence's attention and gradients, once: every layout below holds the same values.
  auto x1 = mt::random_normal<X0>(g, ex, 55);
  auto wq1 = mt::random_normal<WQ0>(g, eq, 51, 0, 0.5);
  auto wk1 = mt::random_normal<WK0>(g, ek, 52, 0, 0.5), wv1 = mt::random_normal<WK0>(g, ek, 53, 0, 0.5);
  auto wo1 = mt::random_normal<WO0>(g, eo, 54, 0, 0.5);
  // A bias on every key, so that each tile's keys read theirs at the tile's own positions.
  const auto bias1 = mt::random_uniform<B0>(g, {1, S}, 56, -2.0, 2.0);
  x1.requires_grad(), wq1.requires_grad(), wk1.requires_grad(), wv1.requires_grad(), wo1.requires_grad();
  const auto whole =
      nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x1, wq1, wk1, wv1, wo1, bias1);
  const auto [gx1, gq1, gk1, gv1, go1] = mt::gradient(weighted_sum(whole, 2), x1, wq1, wk1, wv1, wo1);
  // Host copies, once: each layout's operands are made from them and its results compared with them.
  const auto x_h = mt::gather_all(x1), wq_h = mt::gather_all(wq1), wk_h = mt::gather_all(wk1),
             wv_h = mt::gather_all(wv1), wo_h = mt::gather_all(wo1), bias_h = mt::gather_all(bias1);
  const auto whole_h = mt::gather_all(whole), gx_h = mt::gather_all(gx1), gq_h = mt::gather_all(gq1),
             gk_h = mt::gather_all(gk1), gv_h = mt::gather_all(gv1), go_h = mt::gather_all(go1);
  for_each_type(list<LA, LK, LZ>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", rank " << g.rank());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using WQ = mt::tensor<double, L, d_model, kv_heads, group, d_kv>;
    using WK = mt::tensor<double, L, d_model, kv_heads, d_kv>;
    using WO = mt::tensor<double, L, kv_heads, group, d_kv, d_model>;
    auto x = mt::from_host<X>(g, ex, x_h);
    auto wq = mt::from_host<WQ>(g, eq, wq_h);
    auto wk = mt::from_host<WK>(g, ek, wk_h), wv = mt::from_host<WK>(g, ek, wv_h);
    auto wo = mt::from_host<WO>(g, eo, wo_h);
    x.requires_grad(), wq.requires_grad(), wk.requires_grad(), wv.requires_grad(), wo.requires_grad();
    const auto bias = mt::from_host<mt::tensor<double, L, batch, mlen>>(g, {1, S}, bias_h);
    const auto split =
        nn::ring_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x, wq, wk, wv, wo, bias);
    REQUIRE(max_rel_error(mt::gather_all(split), whole_h) < 1e-12);
    const auto [gx, gq, gk, gv, go] = mt::gradient(weighted_sum(split, 2), x, wq, wk, wv, wo);
    CHECK(max_rel_error(mt::gather_all(gx), gx_h) < 1e-10);
    CHECK(max_rel_error(mt::gather_all(gq), gq_h) < 1e-10);
    CHECK(max_rel_error(mt::gather_all(gk), gk_h) < 1e-10);
    CHECK(max_rel_error(mt::gather_all(gv), gv_h) < 1e-10);
    CHECK(max_rel_error(mt::gather_all(go), go_h) < 1e-10);
  });
}

TEST_CASE("a transformer block with ring attention and residual dropout equals the replicated block", "[gradient]") {
  // Layer norm, ring attention (with a padding bias), residual dropout (rate 0.2), layer norm,
  // feed-forward, residual dropout, with the sequence split over both axes (contiguous or
  // zigzag), with data parallelism (batch over r) or tensor parallelism (heads and d_ff over r)
  // beside it. Dropout's mask is a function of the global index, so the split block drops what
  // the replicated one drops: its result and gradients (x, every weight, the norms' gains and
  // biases) equal the replicated block's with causal_attention.
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LZ = mt::layout<grid, mt::zigzag<length, r_, c_>>;
  using LZB = mt::layout<grid, mt::split<batch, r_>, mt::zigzag<length, c_>>;
  using LZT = mt::layout<grid, mt::split<heads, r_>, mt::split<d_ff, r_>, mt::zigzag<length, c_>>;
  using L0 = mt::layout<grid>;
  constexpr std::int64_t F = 8, S = 7;
  constexpr double rate = 0.2;
  const auto g = world_grid();
  const auto block = [&]<class L>(std::uint64_t seed, const auto& x, const auto& wq, const auto& wk, const auto& wv,
                                  const auto& wo, const auto& gain, const auto& shift, const auto& w1, const auto& w2,
                                  const auto& bias) {
    const auto n1 = nn::layer_norm<d_model>(x, gain, shift);
    const auto a = [&] {
      if constexpr (!std::is_same_v<L, L0>) return nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(n1, wq, wk, wv, wo, bias);
      else return nn::causal_attention<length, mlen, d_model, heads, d_kv>(n1, wq, wk, wv, wo, bias);
    }();
    const auto h = nn::residual_dropout(x, a, rate, seed, 1);
    const auto f = nn::feed_forward<d_model, d_ff>(nn::layer_norm<d_model>(h, gain, shift), w1, w2);
    return nn::residual_dropout(h, f, rate, seed, 2);
  };
  // The block's result and gradients under layout L, gathered; from the same global values.
  const auto run = [&]<class L>(std::uint64_t seed) {
    using X = mt::tensor<double, L, batch, length, d_model>;
    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WO = mt::tensor<double, L, heads, d_kv, d_model>;
    using V = mt::tensor<double, L, d_model>;
    using W1 = mt::tensor<double, L, d_model, d_ff>;
    using W2 = mt::tensor<double, L, d_ff, d_model>;
    auto x = mt::random_normal<X>(g, {B, S, M}, 95);
    auto wq = mt::random_normal<W>(g, {M, H, K}, 91, 0, 0.5), wk = mt::random_normal<W>(g, {M, H, K}, 92, 0, 0.5),
         wv = mt::random_normal<W>(g, {M, H, K}, 93, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {H, K, M}, 94, 0, 0.5);
    auto gain = mt::random_uniform<V>(g, {M}, 96, 0.5, 1.5), shift = mt::random_uniform<V>(g, {M}, 97, -0.5, 0.5);
    auto w1 = mt::random_normal<W1>(g, {M, F}, 98, 0, 0.5);
    auto w2 = mt::random_normal<W2>(g, {F, M}, 99, 0, 0.5);
    const auto bias = nn::padding_bias<length, mlen>(mt::from_host<mt::tensor<double, L, batch, length>>(g, {B, S}, padded_ids(S)), 0.0);
    x.requires_grad(), wq.requires_grad(), wk.requires_grad(), wv.requires_grad(), wo.requires_grad();
    gain.requires_grad(), shift.requires_grad(), w1.requires_grad(), w2.requires_grad();
    const auto y = block.template operator()<L>(seed, x, wq, wk, wv, wo, gain, shift, w1, w2, bias);
    const auto grads = mt::gradient(weighted_sum(y, 2), x, wq, wk, wv, wo, gain, shift, w1, w2);
    std::vector<std::vector<double>> out{mt::gather_all(y)};
    std::apply([&](const auto&... gs) { (out.push_back(mt::gather_all(gs)), ...); }, grads);
    return out;
  };
  const auto want = run.template operator()<L0>(21);
  // The masks matter: another seed's block differs.
  REQUIRE(max_rel_error(run.template operator()<L0>(22)[0], want[0]) > 1e-3);
  for_each_type(list<LA, LZ, LZB, LZT>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", rank " << g.rank());
    const auto got = run.template operator()<L>(21);
    const char* names[] = {"result", "dx", "dwq", "dwk", "dwv", "dwo", "dgain", "dshift", "dw1", "dw2"};
    REQUIRE(got.size() == want.size());
    for (std::size_t n = 0; n < got.size(); ++n) {
      INFO(names[n]);
      CHECK(max_rel_error(got[n], want[n]) < (n == 0 ? 1e-12 : 1e-10));
    }
  });
}

namespace {
// The largest difference relative to the largest expected element: the error of a result in
// bf16, whose rounding is relative to the magnitudes summed, not to each (possibly cancelled) sum.
double normwise_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 0;
  for (std::size_t n = 0; n < got.size(); ++n) {
    const double e = std::abs(double(got[n]) - double(want[n]));
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
    scale = std::max(scale, std::abs(double(want[n])));
  }
  return worst / std::max(scale, 1e-30);
}
}  // namespace

TEST_CASE("ring attention in bf16 takes its products in bf16, its sums in float", "[gradient]") {
  // x and every weight bf16 (the library's bf16 element, leaves of their own: the gradients are
  // bf16 too); q, k, v bf16, the tiles' products of bf16 operands into float scores, the weights
  // and their gradients rounded to bf16 for the products that read them, the accumulators float.
  // Blocks of several tiles (1100 positions: 3, 2, 1 and 1 tiles at 1 to 4 parts), the sequence
  // contiguous or zigzag. The result and the gradients through x and every weight against
  // grouped_causal_attention in float on the whole sequence, all from the same bf16-rounded
  // inputs: within the stated bf16 tolerance, 2e-2 of the largest element (bf16 keeps 8 bits,
  // 2^-8 = 3.9e-3 per rounding, several on the way: q, k, v, the output, the gradients' products),
  // and as close as grouped_causal_attention's own in bf16 (which rounds the scores to bf16 too,
  // where the ring keeps them in float), within a factor 2. The ring in float is the float whole
  // sequence's to 1e-5. The plan of the bf16 step counts every product's operands as bf16.
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LZ = mt::layout<grid, mt::zigzag<length, r_, c_>>;
  using L0 = mt::layout<grid>;
  using mt::bf16;
  constexpr std::int64_t KV = 2, G = 2, S = 1100;
  constexpr double bf16_tolerance = 2e-2;
  const auto g = world_grid();
  for_each_type(list<LA, LZ>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", rank " << g.rank());
    using X = mt::tensor<float, L, batch, length, d_model>;
    using WQ = mt::tensor<float, L, d_model, kv_heads, group, d_kv>;
    using WK = mt::tensor<float, L, d_model, kv_heads, d_kv>;
    using WO = mt::tensor<float, L, kv_heads, group, d_kv, d_model>;
    using X0 = mt::tensor<float, L0, batch, length, d_model>;
    using WQ0 = mt::tensor<float, L0, d_model, kv_heads, group, d_kv>;
    using WK0 = mt::tensor<float, L0, d_model, kv_heads, d_kv>;
    using WO0 = mt::tensor<float, L0, kv_heads, group, d_kv, d_model>;
    const typename X::extents_type ex{1, S, M};
    const typename WQ::extents_type eq{M, KV, G, K};
    const typename WK::extents_type ek{M, KV, K};
    const typename WO::extents_type eo{KV, G, K, M};
    // The inputs rounded to bf16, under L and unsplit, in float and in bf16.
    const auto rounded = [](const auto& t) { return mt::cast<float>(mt::cast<bf16>(t)); };
    auto x = rounded(mt::random_normal<X>(g, ex, 65));
    auto wq = rounded(mt::random_normal<WQ>(g, eq, 61, 0, 0.5));
    auto wk = rounded(mt::random_normal<WK>(g, ek, 62, 0, 0.5)), wv = rounded(mt::random_normal<WK>(g, ek, 63, 0, 0.5));
    auto wo = rounded(mt::random_normal<WO>(g, eo, 64, 0, 0.5));
    auto x0 = mt::from_host<X0>(g, ex, mt::gather_all(x));
    auto wq0 = mt::from_host<WQ0>(g, eq, mt::gather_all(wq));
    auto wk0 = mt::from_host<WK0>(g, ek, mt::gather_all(wk)), wv0 = mt::from_host<WK0>(g, ek, mt::gather_all(wv));
    auto wo0 = mt::from_host<WO0>(g, eo, mt::gather_all(wo));
    // One type per declaration (x and x0 differ in layout: nvcc and clang refuse two in one auto).
    auto x16 = mt::cast<bf16>(x);
    auto x016 = mt::cast<bf16>(x0);
    auto wq16 = mt::cast<bf16>(wq);
    auto wq016 = mt::cast<bf16>(wq0);
    auto wk16 = mt::cast<bf16>(wk), wv16 = mt::cast<bf16>(wv);
    auto wk016 = mt::cast<bf16>(wk0), wv016 = mt::cast<bf16>(wv0);
    auto wo16 = mt::cast<bf16>(wo);
    auto wo016 = mt::cast<bf16>(wo0);
    // The result and the gradients through x and every weight, gathered in float.
    const auto run = [](const auto& attend, auto x, auto wq, auto wk, auto wv, auto wo) {
      x.requires_grad(), wq.requires_grad(), wk.requires_grad(), wv.requires_grad(), wo.requires_grad();
      const auto y = mt::cast<float>(attend(x, wq, wk, wv, wo));
      const auto [gx, gq, gk, gv, go] = mt::gradient(weighted_sum(y, 2), x, wq, wk, wv, wo);
      const auto f = [](const auto& t) { return mt::gather_all(mt::cast<float>(t)); };
      return std::array<std::vector<float>, 6>{f(y), f(gx), f(gq), f(gk), f(gv), f(go)};
    };
    const auto ring = [](const auto&... a) {
      return nn::ring_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(a...);
    };
    const auto whole = [](const auto&... a) {
      return nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(a...);
    };
    const auto ring16 = run(ring, x16, wq16, wk16, wv16, wo16), ring32 = run(ring, x, wq, wk, wv, wo);
    const auto whole16 = run(whole, x016, wq016, wk016, wv016, wo016), exact = run(whole, x0, wq0, wk0, wv0, wo0);
    const char* names[] = {"result", "dx", "dwq", "dwk", "dwv", "dwo"};
    for (std::size_t n = 0; n < 6; ++n) {
      const double e16 = normwise_error(ring16[n], exact[n]), e_whole16 = normwise_error(whole16[n], exact[n]),
                   e32 = normwise_error(ring32[n], exact[n]);
      INFO(names[n] << " against the whole sequence's in float: ring in bf16 " << e16
                    << ", grouped_causal_attention in bf16 " << e_whole16 << ", ring in float " << e32);
      CHECK(e16 < bf16_tolerance);
      CHECK(e16 <= 2 * e_whole16);
      CHECK(e32 < 1e-5);
    }
    // Every product of the step, the ring's tiles included, takes bf16 operands (oneDNN's or
    // cuBLAS's bf16 kernels, float accumulation): the plan counts each as the run calls it.
    const auto flops = [&] {  // in a scope of its own: no real tensor is made while it exists
      const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
      auto px = mt::cast<bf16>(mt::random_normal<X>(pm, ex, 65));
      auto pq = mt::cast<bf16>(mt::random_normal<WQ>(pm, eq, 61));
      auto pk = mt::cast<bf16>(mt::random_normal<WK>(pm, ek, 62)), pv = mt::cast<bf16>(mt::random_normal<WK>(pm, ek, 63));
      auto po = mt::cast<bf16>(mt::random_normal<WO>(pm, eo, 64));
      px.requires_grad(), pq.requires_grad(), pk.requires_grad(), pv.requires_grad(), po.requires_grad();
      mt::reset_plan(pm);
      const auto y = mt::cast<float>(ring(px, pq, pk, pv, po));
      (void)mt::gradient(weighted_sum(y, 2), px, pq, pk, pv, po);
      const auto r = mt::plan_report_of(pm);
      std::int64_t in_bf16 = 0;
      for (const auto& [mnk, f] : r.bf16_product_flops_by_size) in_bf16 += f;
      return std::pair{in_bf16, r.total_flops};
    }();
    INFO("FLOPs of bf16 products " << flops.first << " of " << flops.second);
    CHECK(flops.second > 0);
    CHECK(flops.first == flops.second);
  });
}

namespace {
struct data_ : mt::axis<"data"> {};
struct ctx_ : mt::axis<"context"> {};
struct tp_ : mt::axis<"tensor"> {};
using cube = mt::mesh<data_, ctx_, tp_>;
}  // namespace

TEST_CASE("ring and all-to-all attention on a 3-D mesh: data x context x tensor", "[gradient]") {
  // Every shape [data x context x tensor] of the world's ranks: the batch over data, the sequence
  // over context (7 positions: uneven), the heads over tensor; both attentions equal causal
  // attention on the replicated layout, result and gradients through x and wq, and the ring
  // shifts over the context axis alone.
  using L = mt::layout<cube, mt::split<batch, data_>, mt::split<length, ctx_>, mt::split<heads, tp_>>;
  using L0 = mt::layout<cube>;
  const int p = world_size();
  constexpr std::int64_t S = 7;
  for (int d = 1; d <= p; ++d)
    for (int c = 1; c * d <= p; ++c) {
      if (p % (d * c) != 0) continue;
      const int t = p / (d * c);
      INFO("mesh [data " << d << " x context " << c << " x tensor " << t << "], rank " << world_rank());
      const cube g(MPI_COMM_WORLD, {d, c, t});
      const auto attend = [&]<class Lx>(std::type_identity<Lx>, auto&& attention) {
        using X = mt::tensor<double, Lx, batch, length, d_model>;
        using W = mt::tensor<double, Lx, d_model, heads, d_kv>;
        using WO = mt::tensor<double, Lx, heads, d_kv, d_model>;
        auto x = mt::random_normal<X>(g, {B, S, M}, 91);
        auto wq = mt::random_normal<W>(g, {M, H, K}, 92, 0, 0.5);
        const auto wk = mt::random_normal<W>(g, {M, H, K}, 93, 0, 0.5), wv = mt::random_normal<W>(g, {M, H, K}, 94, 0, 0.5);
        const auto wo = mt::random_normal<WO>(g, {H, K, M}, 95, 0, 0.5);
        x.requires_grad(), wq.requires_grad();
        g.reset_counters();
        const auto y = attention(x, wq, wk, wv, wo);
        const auto counted = g.counters();
        const auto [gx, gq] = mt::gradient(weighted_sum(y, 2), x, wq);
        return std::tuple{mt::gather_all(y), mt::gather_all(gx), mt::gather_all(gq), counted};
      };
      const auto [y0, gx0, gq0, c0] = attend(std::type_identity<L0>{}, [](const auto&... a) {
        return nn::causal_attention<length, mlen, d_model, heads, d_kv>(a...);
      });
      const auto [y1, gx1, gq1, c1] = attend(std::type_identity<L>{}, [](const auto&... a) {
        return nn::ring_causal_attention<length, mlen, d_model, heads, d_kv>(a...);
      });
      const auto [y2, gx2, gq2, c2] = attend(std::type_identity<L>{}, [](const auto&... a) {
        return nn::all_to_all_causal_attention<length, mlen, d_model, heads, d_kv>(a...);
      });
      CHECK(max_rel_error(y1, y0) < 1e-12);
      CHECK(max_rel_error(gx1, gx0) < 1e-10);
      CHECK(max_rel_error(gq1, gq0) < 1e-10);
      CHECK(max_rel_error(y2, y0) < 1e-12);
      CHECK(max_rel_error(gx2, gx0) < 1e-10);
      CHECK(max_rel_error(gq2, gq0) < 1e-10);
      // The ring's forward shifts: c - 1, over the context axis and no other.
      std::int64_t shifts = 0;
      for (const auto& [key, n] : c1) {
        if (key.first != mt::collective::shift) continue;
        CHECK(key.second == mt::axis_set(cube::template mask<ctx_>()));
        shifts += n.calls;
      }
      CHECK(shifts == c - 1);
    }
}
