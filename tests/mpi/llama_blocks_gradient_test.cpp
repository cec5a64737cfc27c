// Llama's blocks: silu, rms_norm, the gated (SwiGLU) feed-forward and grouped-query attention.
// Gradients equal central differences (float64) under replicated and split layouts (batch, the KV
// heads, the group, d_ff split); forward: silu is x sigmoid(x), rms_norm's rows have mean square 1,
// the gated feed-forward equals a host loop, and grouped-query attention equals causal_attention
// with each k and v head repeated over its group.
#include <meshtensor/nn/attention.hpp>
#include <meshtensor/nn/feed_forward.hpp>
#include <meshtensor/nn/rms_norm.hpp>
#include <test_support.hpp>

#include "transformer_dims.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
constexpr std::int64_t B = 2, S = 4, M = 6, KV = 2, G = 2, K = 3, F = 4;

template <class X, class Mesh, class Fn>
void check_grad(const Mesh& g, const typename X::extents_type& ext, std::uint64_t seed, Fn loss_of, std::size_t stride = 3) {
  check_gradient<X>(g, ext, mt::gather_all(mt::random_uniform<X>(g, ext, seed, -1.0, 1.0)), loss_of,
                    {.h = 1e-6, .tol = 1e-6, .stride = stride});
}

double silu(double x) { return x / (1 + std::exp(-x)); }
}  // namespace

TEST_CASE("silu, rms_norm and the gated feed-forward: gradients and forward", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<d_ff, c_>>;
  using L2 = mt::layout<grid, mt::split<d_ff, r_, c_>>;
  using L3 = mt::layout<grid, mt::split<d_model, r_>>;  // rms_norm's statistic allreduced
  const auto g = world_grid();
  for_each_type(list<L0, L1, L2, L3>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using Sc = mt::tensor<double, L, d_model>;
    using W1 = mt::tensor<double, L, d_model, d_ff>;
    using W2 = mt::tensor<double, L, d_ff, d_model>;
    const typename X::extents_type ex{B, S, M};
    auto scale = mt::random_uniform<Sc>(g, {M}, 11, 0.5, 1.5);
    auto wg = mt::random_normal<W1>(g, {M, F}, 12, 0, 0.5), wu = mt::random_normal<W1>(g, {M, F}, 13, 0, 0.5);
    auto wd = mt::random_normal<W2>(g, {F, M}, 14, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 15);
    check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(mt::silu(x * 2.0), 2); });
    check_grad<X>(g, ex, 3, [&](const X& x) { return weighted_sum(nn::rms_norm<d_model>(x, scale, 1e-5), 4); });
    check_grad<Sc>(g, {M}, 5, [&](const Sc& s) { return weighted_sum(nn::rms_norm<d_model>(x0, s, 1e-5), 4); }, 1);
    check_grad<X>(g, ex, 6, [&](const X& x) { return weighted_sum(nn::gated_feed_forward<d_model, d_ff>(x, wg, wu, wd), 7); });
    check_grad<W1>(g, {M, F}, 8,
                   [&](const W1& w) { return weighted_sum(nn::gated_feed_forward<d_model, d_ff>(x0, w, wu, wd), 7); }, 2);
    check_grad<W1>(g, {M, F}, 9,
                   [&](const W1& w) { return weighted_sum(nn::gated_feed_forward<d_model, d_ff>(x0, wg, w, wd), 7); }, 2);
    check_grad<W2>(g, {F, M}, 10,
                   [&](const W2& w) { return weighted_sum(nn::gated_feed_forward<d_model, d_ff>(x0, wg, wu, w), 7); }, 2);

    // Forward, against host loops.
    const auto xs = mt::gather_all(x0);
    const auto si = mt::gather_all(mt::silu(x0)), sg = mt::gather_all(mt::sigmoid(x0));
    for (std::size_t n = 0; n < xs.size(); ++n) REQUIRE(std::abs(si[n] - xs[n] * sg[n]) <= 1e-15);
    const auto ones = mt::from_host<Sc>(g, {M}, std::vector<double>(M, 1.0));
    const auto y = mt::gather_all(nn::rms_norm<d_model>(x0, ones, 0.0));
    for (std::int64_t r = 0; r < B * S; ++r) {
      double ms = 0;
      for (std::int64_t c = 0; c < M; ++c) ms += y[r * M + c] * y[r * M + c] / M;
      REQUIRE(std::abs(ms - 1) < 1e-12);
    }
    const auto hg = mt::gather_all(wg), hu = mt::gather_all(wu), hd = mt::gather_all(wd);
    std::vector<double> want(xs.size(), 0.0);
    for (std::int64_t r = 0; r < B * S; ++r)
      for (std::int64_t f = 0; f < F; ++f) {
        double a = 0, b = 0;
        for (std::int64_t m = 0; m < M; ++m) {
          a += xs[r * M + m] * hg[m * F + f];
          b += xs[r * M + m] * hu[m * F + f];
        }
        for (std::int64_t m = 0; m < M; ++m) want[r * M + m] += silu(a) * b * hd[f * M + m];
      }
    REQUIRE(max_rel_error(mt::gather_all(nn::gated_feed_forward<d_model, d_ff>(x0, wg, wu, wd)), want) < 1e-12);
  });
}

TEST_CASE("grouped-query attention: gradients, and causal attention with its k and v heads repeated", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<kv_heads, c_>, mt::split<heads, c_>>;
  using L2 = mt::layout<grid, mt::split<kv_heads, r_>, mt::split<group, c_>, mt::split<heads, r_, c_>>;
  const auto g = world_grid();
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using WQ = mt::tensor<double, L, d_model, kv_heads, group, d_kv>;
    using WK = mt::tensor<double, L, d_model, kv_heads, d_kv>;
    using WO = mt::tensor<double, L, kv_heads, group, d_kv, d_model>;
    const typename X::extents_type ex{B, S, M};
    auto wq = mt::random_normal<WQ>(g, {M, KV, G, K}, 21, 0, 0.5);
    auto wk = mt::random_normal<WK>(g, {M, KV, K}, 22, 0, 0.5), wv = mt::random_normal<WK>(g, {M, KV, K}, 23, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {KV, G, K, M}, 24, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 25);
    const auto gqa = [](const X& x, const WQ& q, const WK& k, const WK& v, const WO& o,
                        nn::attention_memory mem = nn::attention_memory::keep_all) {
      return nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x, q, k, v, o, mem);
    };
    check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(gqa(x, wq, wk, wv, wo), 2); });
    check_grad<WQ>(g, {M, KV, G, K}, 3, [&](const WQ& w) { return weighted_sum(gqa(x0, w, wk, wv, wo), 2); }, 5);
    check_grad<WK>(g, {M, KV, K}, 4, [&](const WK& w) { return weighted_sum(gqa(x0, wq, w, wv, wo), 2); }, 2);
    check_grad<WK>(g, {M, KV, K}, 5,
                   [&](const WK& w) { return weighted_sum(gqa(x0, wq, wk, w, wo, nn::attention_memory::recompute_core), 2); }, 2);
    check_grad<WO>(g, {KV, G, K, M}, 6, [&](const WO& w) { return weighted_sum(gqa(x0, wq, wk, wv, w), 2); }, 5);

    // Multi-head attention with heads = kv_heads x group (row-major, so wq and wo are the same
    // numbers) and each k, v head repeated over its group.
    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WOM = mt::tensor<double, L, heads, d_kv, d_model>;
    const auto repeat = [&](const WK& w) {
      const auto h = mt::gather_all(w);
      std::vector<double> r(static_cast<std::size_t>(M * KV * G * K));
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t kv = 0; kv < KV; ++kv)
          for (std::int64_t gr = 0; gr < G; ++gr)
            for (std::int64_t d = 0; d < K; ++d) r[((m * KV + kv) * G + gr) * K + d] = h[(m * KV + kv) * K + d];
      return mt::from_host<W>(g, {M, KV * G, K}, r);
    };
    const auto mha = nn::causal_attention<length, mlen, d_model, heads, d_kv>(
        x0, mt::from_host<W>(g, {M, KV * G, K}, mt::gather_all(wq)), repeat(wk), repeat(wv),
        mt::from_host<WOM>(g, {KV * G, K, M}, mt::gather_all(wo)));
    REQUIRE(max_rel_error(mt::gather_all(gqa(x0, wq, wk, wv, wo)), mt::gather_all(mha)) < 1e-12);
  });
}
