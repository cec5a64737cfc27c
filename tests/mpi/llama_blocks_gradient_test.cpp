// Llama's blocks: silu, rms_norm, the gated (SwiGLU) feed-forward, grouped-query attention and
// rotary position embeddings. Gradients equal central differences (float64) under replicated and
// split layouts (batch, the KV heads, the group, d_ff split; rope's positions split unevenly and
// zigzag); forward: silu is x sigmoid(x), rms_norm's rows have mean square 1, the gated
// feed-forward equals a host loop, grouped-query attention equals causal_attention with each k and
// v head repeated over its group, rope equals the rotate-half formula at global positions, and its
// frequencies and one rotated head equal Hugging Face transformers 4.44's.
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/nn/attention.hpp>
#include <meshtensor/nn/feed_forward.hpp>
#include <meshtensor/nn/rms_norm.hpp>
#include <meshtensor/nn/rope.hpp>
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

TEST_CASE("rope: gradients and the rotate-half formula at global positions, under split and zigzag positions", "[gradient]") {
  constexpr std::int64_t RS = 7, RH = 2, RD = 4;  // 7 positions: uneven over 2, 3 and 4 parts, and 2P chunks
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<length, r_, c_>>;
  using L2 = mt::layout<grid, mt::zigzag<length, r_>, mt::split<heads, c_>>;
  using L3 = mt::layout<grid, mt::split<batch, c_>, mt::zigzag<length, r_>>;
  const auto g = world_grid();
  const nn::rope_config config{.theta = 50.0, .position_offset = 3};
  for_each_type(list<L0, L1, L2, L3>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, heads, d_kv>;
    const typename X::extents_type ex{B, RS, RH, RD};
    check_grad<X>(g, ex, 31, [&](const X& x) { return weighted_sum(nn::rope<length, d_kv>(x, config), 2); }, 1);

    // Forward: features (i, i + d/2) of position p rotated by (p + 3) * 50^(-2i/d), written out here.
    const auto x0 = mt::random_normal<X>(g, ex, 32);
    const auto xs = mt::gather_all(x0), ys = mt::gather_all(nn::rope<length, d_kv>(x0, config));
    std::vector<double> want(xs.size());
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t p = 0; p < RS; ++p)
        for (std::int64_t h = 0; h < RH; ++h)
          for (std::int64_t i = 0; i < RD / 2; ++i) {
            const std::int64_t at = ((b * RS + p) * RH + h) * RD + i, partner = at + RD / 2;
            const double angle = static_cast<double>(p + 3) * std::pow(50.0, -2.0 * static_cast<double>(i) / RD);
            want[at] = xs[at] * std::cos(angle) - xs[partner] * std::sin(angle);
            want[partner] = xs[partner] * std::cos(angle) + xs[at] * std::sin(angle);
          }
    REQUIRE(max_rel_error(ys, want) < 1e-12);
  });
}

TEST_CASE("rope: Hugging Face transformers' frequencies (default and llama3) and rotated head", "[gradient]") {
  // transformers 4.44.2, ROPE_INIT_FUNCTIONS["default"] and ["llama3"] for d = 128 (Llama 3.1: theta
  // 500000, factor 8, low and high frequency factors 1 and 4, 8192 original positions). transformers
  // computes them in float32: 2e-6 covers its rounding of the exponent (theta^(-2i/d)).
  const auto f = nn::rope_frequencies(128, {});
  REQUIRE(std::abs(f[1] / 0.8659643530845642 - 1) < 2e-6);
  REQUIRE(std::abs(f[63] / 0.00011547819303814322 - 1) < 2e-6);
  const auto l3 = nn::rope_frequencies(128, {.theta = 500000.0, .llama3 = nn::rope_llama3_scaling{}});
  const std::vector<std::pair<int, double>> hf{{0, 1.0}, {10, 0.12868738174438477}, {20, 0.016560440883040428},
                                               {30, 0.0013718936825171113}, {35, 9.556212171446532e-05},
                                               {40, 3.428102354519069e-05}, {45, 1.2297638932068367e-05},
                                               {50, 4.411534519022098e-06}, {63, 3.068925877869333e-07}};
  for (const auto& [i, want] : hf) {
    INFO("llama3 frequency " << i);
    REQUIRE(std::abs(l3[static_cast<std::size_t>(i)] / want - 1) < 2e-6);
  }

  // One head of 8 features at positions 0, 3 and 1000 (theta 10000), as transformers'
  // apply_rotary_pos_emb rotates it (its angles in float32: 1e-4 at position 1000).
  using X = mt::tensor<double, mt::layout<grid>, length, d_kv>;
  const auto g = world_grid();
  std::vector<double> x(8);
  for (std::size_t i = 0; i < 8; ++i) x[i] = 0.1 * static_cast<double>(i + 1) - 0.35;
  const std::vector<std::pair<std::int64_t, std::vector<double>>> rotated{
      {0, x},
      {3, {0.22633012458682056, -0.21718053072690963, -0.06047592693939799, 0.04864977846154948, -0.18377887532114984,
           0.1945060953497888, 0.3483427406288684, 0.45014798812335366}},
      {1000, {-0.2646266996860504, -0.002756416797637856, 0.23236097097396852, -0.3516468137502671, -0.1223630309104919,
              0.29153456687927254, -0.26647397279739393, 0.2852095991373063}}};
  for (const auto& [position, want] : rotated) {
    INFO("position " << position);
    const auto y = mt::gather_all(nn::rope<length, d_kv>(mt::from_host<X>(g, {1, 8}, x), {.position_offset = position}));
    for (std::size_t i = 0; i < 8; ++i) REQUIRE(std::abs(y[i] - want[i]) < (position < 1000 ? 2e-6 : 1e-4));
  }

  // A rotated dim of odd extent is refused, naming it (every rank, before any work).
  const auto odd = mt::from_host<X>(g, {1, 3}, std::vector<double>(3, 1.0));
  REQUIRE_THROWS_WITH((nn::rope<length, d_kv>(odd)), Catch::Matchers::ContainsSubstring("rotated dim's extent is 3"));
}

TEST_CASE("grouped-query attention with rope: a host attention of rotated q and k, and gradients", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<kv_heads, c_>>;
  using L2 = mt::layout<grid, mt::split<kv_heads, r_>, mt::split<group, c_>>;
  constexpr std::int64_t RS = 5, RK = 4;  // d_kv even: rope rotates its halves
  const nn::rope_config rope{.theta = 20.0, .position_offset = 2};
  const auto g = world_grid();
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using WQ = mt::tensor<double, L, d_model, kv_heads, group, d_kv>;
    using WK = mt::tensor<double, L, d_model, kv_heads, d_kv>;
    using WO = mt::tensor<double, L, kv_heads, group, d_kv, d_model>;
    const typename X::extents_type ex{B, RS, M};
    auto wq = mt::random_normal<WQ>(g, {M, KV, G, RK}, 51, 0, 0.5);
    auto wk = mt::random_normal<WK>(g, {M, KV, RK}, 52, 0, 0.5), wv = mt::random_normal<WK>(g, {M, KV, RK}, 53, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {KV, G, RK, M}, 54, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 55);
    const auto gqa = [&](const X& x, const WQ& q) {
      return nn::grouped_causal_attention<length, mlen, d_model, kv_heads, group, d_kv>(x, q, wk, wv, wo, rope);
    };
    check_grad<X>(g, ex, 56, [&](const X& x) { return weighted_sum(gqa(x, wq), 2); }, 2);
    check_grad<WQ>(g, {M, KV, G, RK}, 57, [&](const WQ& w) { return weighted_sum(gqa(x0, w), 2); }, 3);

    // Forward on the host: q = x wq, k = x wk, v = x wv per (batch, KV head, query head), q at
    // position s and k at t rotated by (p + 2) * 20^(-2i/d), causal softmax of q.k / sqrt(d).
    const auto xs = mt::gather_all(x0), hq = mt::gather_all(wq), hk = mt::gather_all(wk), hv = mt::gather_all(wv),
               ho = mt::gather_all(wo);
    const auto rotate = [&](std::vector<double> u, std::int64_t p) {
      for (std::int64_t i = 0; i < RK / 2; ++i) {
        const double a = static_cast<double>(p + 2) * std::pow(20.0, -2.0 * static_cast<double>(i) / RK);
        const double first = u[i], second = u[i + RK / 2];
        u[i] = first * std::cos(a) - second * std::sin(a);
        u[i + RK / 2] = second * std::cos(a) + first * std::sin(a);
      }
      return u;
    };
    std::vector<double> want(xs.size(), 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t kv = 0; kv < KV; ++kv)
        for (std::int64_t gr = 0; gr < G; ++gr) {
          std::vector<std::vector<double>> q(RS, std::vector<double>(RK)), k = q, v = q;
          for (std::int64_t s = 0; s < RS; ++s) {
            for (std::int64_t d = 0; d < RK; ++d)
              for (std::int64_t m = 0; m < M; ++m) {
                const double xv = xs[(b * RS + s) * M + m];
                q[s][d] += xv * hq[((m * KV + kv) * G + gr) * RK + d];
                k[s][d] += xv * hk[(m * KV + kv) * RK + d];
                v[s][d] += xv * hv[(m * KV + kv) * RK + d];
              }
            q[s] = rotate(q[s], s);
            k[s] = rotate(k[s], s);
          }
          for (std::int64_t s = 0; s < RS; ++s) {
            std::vector<double> w(static_cast<std::size_t>(s + 1));
            double top = -1e300, total = 0;
            for (std::int64_t t = 0; t <= s; ++t) {
              for (std::int64_t d = 0; d < RK; ++d) w[t] += q[s][d] * k[t][d] / std::sqrt(double(RK));
              top = std::max(top, w[t]);
            }
            for (auto& e : w) total += (e = std::exp(e - top));
            for (std::int64_t d = 0; d < RK; ++d) {
              double o = 0;
              for (std::int64_t t = 0; t <= s; ++t) o += w[t] / total * v[t][d];
              for (std::int64_t m = 0; m < M; ++m) want[(b * RS + s) * M + m] += o * ho[((kv * G + gr) * RK + d) * M + m];
            }
          }
        }
    REQUIRE(max_rel_error(mt::gather_all(gqa(x0, wq)), want) < 1e-12);
  });
}
