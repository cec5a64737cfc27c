// Context parallelism by all-to-all (nn::all_to_all_causal_attention): with the sequence split over
// mesh axes (alone, with data parallelism, with tensor parallelism over the heads), the result
// equals causal_attention's on the whole sequence, uneven lengths included; the collectives
// counted are the four alltoalls (and the heads' allreduce) the header states and its plan says;
// gradients through x and every weight equal central differences. With rope, grouped-query
// attention by all-to-all equals grouped_causal_attention's rope form.
#include <meshtensor/nn/context_attention.hpp>
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
}  // namespace

TEST_CASE("all-to-all context attention equals causal attention on the whole sequence", "[gradient]") {
  // The sequence over both axes; with batch over one (data); with the heads over one (tensor).
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LB = mt::layout<grid, mt::split<batch, r_>, mt::split<length, c_>>;
  using LC = mt::layout<grid, mt::split<heads, r_>, mt::split<length, c_>>;
  using L0 = mt::layout<grid>;
  const auto g = world_grid();
  const auto S = GENERATE(std::int64_t{8}, std::int64_t{7});  // 7: uneven over 2 and 4 parts
  for_each_type(list<LA, LB, LC>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", length " << S);
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
    const auto att = [](const X& x, const W& q, const W& k, const W& v, const WO& o,
                        nn::attention_memory mem = nn::attention_memory::keep_all) {
      return nn::all_to_all_causal_attention<length, mlen, d_model, heads, d_kv>(x, q, k, v, o, mem);
    };
    const auto whole = nn::causal_attention<length, mlen, d_model, heads, d_kv>(
        mt::from_host<X0>(g, ex, mt::gather_all(x0)), mt::from_host<W0>(g, ew, mt::gather_all(wq)),
        mt::from_host<W0>(g, ew, mt::gather_all(wk)), mt::from_host<W0>(g, ew, mt::gather_all(wv)),
        mt::from_host<WO0>(g, {H, K, M}, mt::gather_all(wo)));
    g.reset_counters();
    const auto split = att(x0, wq, wk, wv, wo);
    const auto counted = calls_of(g);
    REQUIRE(max_rel_error(mt::gather_all(split), mt::gather_all(whole)) < 1e-12);
    REQUIRE(max_rel_error(mt::gather_all(att(x0, wq, wk, wv, wo, nn::attention_memory::recompute_core)),
                          mt::gather_all(whole)) < 1e-12);

    // Four alltoalls over the sequence's axes; the heads' allreduce over their own axes (LC) at the
    // output projection. (Counted by type, as plans are: also over axes of one processor.)
    const auto seq = typename L::template axes_of<length>{};
    const unsigned seq_mask = [&]<class... As>(mt::type_list<As...>) { return grid::template mask<As...>(); }(seq);
    mt::comm_counters want;
    want[{mt::collective::alltoall, mt::axis_set(seq_mask)}].calls = 4;
    if constexpr (std::is_same_v<L, LC>) want[{mt::collective::allreduce, mt::axis_set(grid::template mask<r_>())}].calls = 1;
    require_counts(counted, want);

    if (S == 7) {
      check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(att(x, wq, wk, wv, wo), 2); }, 5);
      check_grad<W>(g, ew, 3, [&](const W& w) { return weighted_sum(att(x0, w, wk, wv, wo), 2); }, 4);
      check_grad<W>(g, ew, 4, [&](const W& w) { return weighted_sum(att(x0, wq, w, wv, wo), 2); }, 4);
      check_grad<W>(g, ew, 5,
                    [&](const W& w) { return weighted_sum(att(x0, wq, wk, w, wo, nn::attention_memory::recompute_core), 2); }, 4);
      check_grad<WO>(g, {H, K, M}, 6, [&](const WO& w) { return weighted_sum(att(x0, wq, wk, wv, w), 2); }, 4);
    }
  });
}

TEST_CASE("grouped-query attention by all-to-all equals grouped_causal_attention", "[gradient]") {
  // The sequence over both axes; with batch over one; with the group (query heads) over one.
  using LA = mt::layout<grid, mt::split<length, r_, c_>>;
  using LB = mt::layout<grid, mt::split<batch, r_>, mt::split<length, c_>>;
  using LC = mt::layout<grid, mt::split<group, r_>, mt::split<length, c_>>;
  using L0 = mt::layout<grid>;
  constexpr std::int64_t KV = 4, G = 2;
  const auto g = world_grid();
  const auto S = GENERATE(std::int64_t{8}, std::int64_t{7});
  for_each_type(list<LA, LB, LC>{}, [&]<class L>() {
    INFO(layout_name<L>() << ", length " << S);
    using X = mt::tensor<double, L, batch, length, d_model>;
    using WQ = mt::tensor<double, L, d_model, kv_heads, group, d_kv>;
    using WK = mt::tensor<double, L, d_model, kv_heads, d_kv>;
    using WO = mt::tensor<double, L, kv_heads, group, d_kv, d_model>;
    const typename X::extents_type ex{B, S, M};
    auto wq = mt::random_normal<WQ>(g, {M, KV, G, K}, 41, 0, 0.5);
    auto wk = mt::random_normal<WK>(g, {M, KV, K}, 42, 0, 0.5), wv = mt::random_normal<WK>(g, {M, KV, K}, 43, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {KV, G, K, M}, 44, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 45);
    const auto att = [](const X& x, const WQ& q, const WK& k, const WK& v, const WO& o) {
      return nn::all_to_all_grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x, q, k, v, o);
    };
    const auto on_one = [&](const auto& t) { return mt::from_host<mt::with_layout_t<std::remove_cvref_t<decltype(t)>, L0>>(g, t.extents(), mt::gather_all(t)); };
    const auto whole = nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(
        on_one(x0), on_one(wq), on_one(wk), on_one(wv), on_one(wo));
    g.reset_counters();
    const auto split = att(x0, wq, wk, wv, wo);
    const auto counted = calls_of(g);
    REQUIRE(max_rel_error(mt::gather_all(split), mt::gather_all(whole)) < 1e-12);
    {
      // With rope (d_kv even): q and k rotated where the positions are, before they move, at
      // their global positions; and the rotation does change the result.
      constexpr std::int64_t RK = 4;
      const nn::rope_config rope{.theta = 20.0, .position_offset = 1};
      auto rq = mt::random_normal<WQ>(g, {M, KV, G, RK}, 46, 0, 0.5);
      auto rk = mt::random_normal<WK>(g, {M, KV, RK}, 47, 0, 0.5), rv = mt::random_normal<WK>(g, {M, KV, RK}, 48, 0, 0.5);
      auto ro = mt::random_normal<WO>(g, {KV, G, RK, M}, 49, 0, 0.5);
      const auto rotated = mt::gather_all(nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(
          on_one(x0), on_one(rq), on_one(rk), on_one(rv), on_one(ro), rope));
      REQUIRE(max_rel_error(mt::gather_all(nn::all_to_all_grouped_causal_attention<length, mlen, d_model, kv_heads, group,
                                                                                     d_kv>(x0, rq, rk, rv, ro, rope)),
                            rotated) < 1e-12);
      REQUIRE(max_rel_error(mt::gather_all(att(x0, rq, rk, rv, ro)), rotated) > 1e-3);
    }
    const auto seq = typename L::template axes_of<length>{};
    const unsigned seq_mask = [&]<class... As>(mt::type_list<As...>) { return grid::template mask<As...>(); }(seq);
    mt::comm_counters want;
    want[{mt::collective::alltoall, mt::axis_set(seq_mask)}].calls = 4;
    if constexpr (std::is_same_v<L, LC>) want[{mt::collective::allreduce, mt::axis_set(grid::template mask<r_>())}].calls = 1;
    require_counts(counted, want);
    if (S == 7) {
      check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(att(x, wq, wk, wv, wo), 2); }, 5);
      check_grad<WQ>(g, {M, KV, G, K}, 3, [&](const WQ& w) { return weighted_sum(att(x0, w, wk, wv, wo), 2); }, 7);
      check_grad<WK>(g, {M, KV, K}, 4, [&](const WK& w) { return weighted_sum(att(x0, wq, w, wv, wo), 2); }, 4);
      check_grad<WK>(g, {M, KV, K}, 5, [&](const WK& w) { return weighted_sum(att(x0, wq, wk, w, wo), 2); }, 4);
      check_grad<WO>(g, {KV, G, K, M}, 6, [&](const WO& w) { return weighted_sum(att(x0, wq, wk, wv, w), 2); }, 7);
    }
  });
}
