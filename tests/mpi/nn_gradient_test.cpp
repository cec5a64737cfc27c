// nn layers: gradients of layer_norm, causal attention, softmax cross-entropy, feed_forward and
// dense equal central finite differences (float64), under replicated and split layouts; attention
// is causal and the same under every layout; dropout's mask is the same under every layout.
#include <meshtensor/nn/attention.hpp>
#include <meshtensor/nn/cross_entropy.hpp>
#include <meshtensor/nn/dense.hpp>
#include <meshtensor/nn/dropout.hpp>
#include <meshtensor/nn/feed_forward.hpp>
#include <meshtensor/nn/layer_norm.hpp>
#include <test_support.hpp>

#include "transformer_dims.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
// x uniform in [-1, 1) (seed); every stride-th element, h = 1e-6, tolerance 1e-6.
template <class X, class M, class F>
void check_grad(const M& g, const typename X::extents_type& ext, std::uint64_t seed, F loss_of, std::size_t stride = 5) {
  check_gradient<X>(g, ext, mt::gather_all(mt::random_uniform<X>(g, ext, seed, -1.0, 1.0)), loss_of,
                    {.h = 1e-6, .tol = 1e-6, .stride = stride});
}
}  // namespace

TEST_CASE("layer_norm gradients equal central differences", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<d_model, c_>>;
  using L2 = mt::layout<grid, mt::split<d_model, r_, c_>>;
  const auto g = world_grid();
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using S = mt::tensor<double, L, d_model>;
    const typename X::extents_type ex{2, 3, 8};
    auto scale = mt::random_uniform<S>(g, {8}, 11, 0.5, 1.5);
    auto bias = mt::random_normal<S>(g, {8}, 12);
    auto x0 = mt::random_normal<X>(g, ex, 13);
    check_grad<X>(g, ex, 1, [&](const X& x) { return weighted_sum(nn::layer_norm<d_model>(x, scale, bias, 1e-5), 2); });
    check_grad<S>(g, {8}, 3, [&](const S& s) { return weighted_sum(nn::layer_norm<d_model>(x0, s, bias, 1e-5), 2); }, 1);
    check_grad<S>(g, {8}, 4, [&](const S& b) { return weighted_sum(nn::layer_norm<d_model>(x0, scale, b, 1e-5), 2); }, 1);
    // More rows than a chunk of the GPU's scale and bias sums (64 rows, kernels/rows.hpp; run on the
    // CPU by mpi.nn_gradient_test.team_rows): 150 rows, three chunks, the last one partial.
    const auto x_long = mt::random_normal<X>(g, {5, 30, 8}, 14);
    check_grad<S>(g, {8}, 5, [&](const S& s) { return weighted_sum(nn::layer_norm<d_model>(x_long, s, bias, 1e-5), 2); }, 1);
    check_grad<S>(g, {8}, 6, [&](const S& b) { return weighted_sum(nn::layer_norm<d_model>(x_long, scale, b, 1e-5), 2); }, 1);
    // Forward: every row has mean 0 and variance 1 before scale and bias.
    const auto y = mt::gather_all(nn::normalize<d_model>(x0, 0.0));
    for (std::size_t r = 0; r < 6; ++r) {
      double m = 0, v = 0;
      for (std::size_t c = 0; c < 8; ++c) m += y[r * 8 + c] / 8;
      for (std::size_t c = 0; c < 8; ++c) v += (y[r * 8 + c] - m) * (y[r * 8 + c] - m) / 8;
      REQUIRE(std::abs(m) < 1e-12);
      REQUIRE(std::abs(v - 1) < 1e-10);
    }
  });
}

TEST_CASE("causal attention gradients equal central differences", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<heads, c_>>;
  using L2 = mt::layout<grid, mt::split<heads, r_, c_>>;
  const auto g = world_grid();
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WO = mt::tensor<double, L, heads, d_kv, d_model>;
    const typename X::extents_type ex{2, 4, 6};
    const typename W::extents_type ew{6, 4, 3};
    auto wq = mt::random_normal<W>(g, ew, 21, 0, 0.5), wk = mt::random_normal<W>(g, ew, 22, 0, 0.5),
         wv = mt::random_normal<W>(g, ew, 23, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {4, 3, 6}, 24, 0, 0.5);
    auto x0 = mt::random_normal<X>(g, ex, 25);
    auto att = [&](const X& x, const W& q, const W& k, const WO& o) {
      return nn::causal_attention<length, mlen, d_model, heads, d_kv>(x, q, k, wv, o);
    };
    check_grad<X>(g, ex, 5, [&](const X& x) { return weighted_sum(att(x, wq, wk, wo), 6); }, 7);
    check_grad<W>(g, ew, 7, [&](const W& w) { return weighted_sum(att(x0, w, wk, wo), 6); }, 7);
    check_grad<W>(g, ew, 8, [&](const W& w) { return weighted_sum(att(x0, wq, w, wo), 6); }, 7);
    check_grad<WO>(g, {4, 3, 6}, 9, [&](const WO& w) { return weighted_sum(att(x0, wq, wk, w), 6); }, 7);
  });
}

TEST_CASE("causal attention is causal and the same under every layout", "[nn]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<heads, c_>>;
  using L2 = mt::layout<grid, mt::split<heads, r_, c_>>;
  const auto g = world_grid();
  std::vector<double> reference;
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WO = mt::tensor<double, L, heads, d_kv, d_model>;
    const typename X::extents_type ex{2, 5, 6};
    const typename W::extents_type ew{6, 4, 3};
    auto wq = mt::random_normal<W>(g, ew, 31), wk = mt::random_normal<W>(g, ew, 32), wv = mt::random_normal<W>(g, ew, 33);
    auto wo = mt::random_normal<WO>(g, {4, 3, 6}, 34);
    auto host = mt::gather_all(mt::random_normal<X>(g, ex, 35));
    auto run = [&](const std::vector<double>& h) {
      return mt::gather_all(nn::causal_attention<length, mlen, d_model, heads, d_kv>(
          mt::from_host<X>(g, ex, h), wq, wk, wv, wo));
    };
    const auto y = run(host);
    if (reference.empty()) reference = y;
    REQUIRE(max_rel_error(y, reference) < 1e-12);
    // Changing position 3 of every sequence leaves the outputs at positions 0..2 alone and changes 3.
    auto changed = host;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t d = 0; d < 6; ++d) changed[(b * 5 + 3) * 6 + d] += 1.0;
    const auto y2 = run(changed);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t l = 0; l < 5; ++l) {
        double diff = 0;
        for (std::size_t d = 0; d < 6; ++d) diff += std::abs(y2[(b * 5 + l) * 6 + d] - y[(b * 5 + l) * 6 + d]);
        INFO("batch " << b << " position " << l);
        if (l < 3) REQUIRE(diff == 0.0);
        else REQUIRE(diff > 1e-6);
      }
  });
}

TEST_CASE("softmax cross-entropy: gradients and values, vocab split or not", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<vocab, c_>>;
  using L2 = mt::layout<grid, mt::split<vocab, r_, c_>>;
  const auto g = world_grid();
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using Z = mt::tensor<double, L, batch, length, vocab>;
    using Y = mt::tensor<int, L, batch, length>;
    const typename Z::extents_type ez{2, 3, 8};
    const std::vector<int> ids{0, 7, 3, 5, 5, 1};
    auto labels = mt::from_host<Y>(g, {2, 3}, ids);
    check_grad<Z>(g, ez, 41, [&](const Z& z) { return weighted_sum(nn::softmax_cross_entropy<vocab>(z, labels), 42); }, 1);
    check_grad<Z>(g, ez, 43, [&](const Z& z) {
      return weighted_sum(nn::softmax_cross_entropy<vocab>(z, labels, 0.1), 42);
    }, 3);
    // Values against -log softmax computed here on the host.
    auto z = mt::random_normal<Z>(g, ez, 44, 0, 3);
    const auto hz = mt::gather_all(z);
    const auto loss = mt::gather_all(nn::softmax_cross_entropy<vocab>(z, labels));
    for (std::size_t r = 0; r < 6; ++r) {
      double s = 0;
      for (std::size_t v = 0; v < 8; ++v) s += std::exp(hz[r * 8 + v]);
      REQUIRE(std::abs(loss[r] - (std::log(s) - hz[r * 8 + ids[r]])) < 1e-12);
    }
  });
}

TEST_CASE("feed_forward and dense gradients equal central differences", "[gradient]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<d_ff, c_>>;
  const auto g = world_grid();
  for_each_type(list<L0, L1>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, d_model>;
    using W1 = mt::tensor<double, L, d_model, d_ff>;
    using W2 = mt::tensor<double, L, d_ff, d_model>;
    using B = mt::tensor<double, L, d_ff>;
    auto w1 = nn::normal_fan_in<W1, d_model>(g, {6, 8}, 51), w1b = nn::normal_fan_in<W1, d_model>(g, {6, 8}, 50);
    auto w2 = nn::normal_fan_in<W2, d_ff>(g, {8, 6}, 52);
    auto b = mt::random_normal<B>(g, {8}, 53);
    check_grad<X>(g, {4, 6}, 54, [&](const X& x) {
      return weighted_sum(nn::feed_forward<d_model, d_ff>(x, w1, w2), 55) +
             weighted_sum(mt::tanh(nn::dense<d_model, d_ff>(x, w1b, b)), 56);
    }, 3);
    auto x0 = mt::random_normal<X>(g, {4, 6}, 57);
    check_grad<W1>(g, {6, 8}, 58, [&](const W1& w) { return weighted_sum(nn::feed_forward<d_model, d_ff>(x0, w, w2), 55); }, 3);
  });
}

TEST_CASE("dropout's mask is the same under every layout and changes with the step", "[nn]") {
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<d_model, c_>>;
  using L2 = mt::layout<grid, mt::split<d_model, c_, r_>>;
  const auto g = world_grid();
  std::vector<float> reference, other_step;
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<float, L, batch, d_model>;
    auto x = mt::full<X>(g, {64, 64}, 2.0f);
    const auto y = mt::gather_all(nn::dropout(x, 0.25, 7, 3));
    const auto y2 = mt::gather_all(nn::dropout(x, 0.25, 7, 4));
    std::size_t dropped = 0, differ = 0;
    for (std::size_t n = 0; n < y.size(); ++n) {
      REQUIRE((y[n] == 0.0f || std::abs(y[n] - 2.0f / 0.75f) < 1e-6f));
      dropped += y[n] == 0.0f;
      differ += (y[n] == 0.0f) != (y2[n] == 0.0f);
    }
    REQUIRE(std::abs(double(dropped) / y.size() - 0.25) < 0.03);
    REQUIRE(differ > 100);
    if (reference.empty()) reference = y;
    REQUIRE(y == reference);
  });
}

// Uneven splits: every split dim's extent below (or not a multiple of) its parts at 2, 3, 4 and 6
// ranks, so parts differ and some processors hold nothing of heads or batch.
TEST_CASE("nn layers under uneven splits: gradients equal central differences, values equal the host's",
          "[gradient]") {
  using L1 = mt::layout<grid, mt::split<batch, r_>, mt::split<d_model, c_>, mt::split<vocab, c_>>;
  using L2 = mt::layout<grid, mt::split<heads, c_, r_>, mt::split<vocab, r_, c_>, mt::split<d_ff, r_, c_>>;
  const auto g = world_grid();
  for_each_type(list<L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using S = mt::tensor<double, L, d_model>;
    auto scale = mt::random_uniform<S>(g, {7}, 61, 0.5, 1.5);
    auto bias = mt::random_normal<S>(g, {7}, 62);
    check_grad<X>(g, {3, 2, 7}, 63, [&](const X& x) { return weighted_sum(nn::layer_norm<d_model>(x, scale, bias, 1e-5), 2); }, 3);

    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WO = mt::tensor<double, L, heads, d_kv, d_model>;
    auto wq = mt::random_normal<W>(g, {7, 3, 2}, 64, 0, 0.5), wk = mt::random_normal<W>(g, {7, 3, 2}, 65, 0, 0.5),
         wv = mt::random_normal<W>(g, {7, 3, 2}, 66, 0, 0.5);
    auto wo = mt::random_normal<WO>(g, {3, 2, 7}, 67, 0, 0.5);
    check_grad<X>(g, {3, 3, 7}, 68, [&](const X& x) {
      return weighted_sum(nn::causal_attention<length, mlen, d_model, heads, d_kv>(x, wq, wk, wv, wo), 6);
    }, 7);
    {  // selective recomputation: attention's core run again in the backward pass, the same gradients
      constexpr auto again = nn::attention_memory::recompute_core;
      check_grad<X>(g, {3, 3, 7}, 68, [&](const X& x) {
        return weighted_sum(nn::causal_attention<length, mlen, d_model, heads, d_kv>(x, wq, wk, wv, wo, again), 6);
      }, 7);
      auto x = mt::random_normal<X>(g, {3, 3, 7}, 71);
      wq.requires_grad(), wk.requires_grad(), wv.requires_grad(), wo.requires_grad();
      const auto kept = mt::gradient(
          weighted_sum(nn::causal_attention<length, mlen, d_model, heads, d_kv>(x, wq, wk, wv, wo), 6), wq, wk, wv, wo);
      const auto recomputed = mt::gradient(
          weighted_sum(nn::causal_attention<length, mlen, d_model, heads, d_kv>(x, wq, wk, wv, wo, again), 6), wq, wk,
          wv, wo);
      require_close(mt::gather_all(std::get<0>(recomputed)), mt::gather_all(std::get<0>(kept)), 1e-12);
      require_close(mt::gather_all(std::get<1>(recomputed)), mt::gather_all(std::get<1>(kept)), 1e-12);
      require_close(mt::gather_all(std::get<2>(recomputed)), mt::gather_all(std::get<2>(kept)), 1e-12);
      require_close(mt::gather_all(std::get<3>(recomputed)), mt::gather_all(std::get<3>(kept)), 1e-12);
    }

    using Z = mt::tensor<double, L, batch, length, vocab>;
    using Y = mt::tensor<int, L, batch, length>;
    const std::vector<int> ids{0, 6, 3, 5, 5, 1};
    auto labels = mt::from_host<Y>(g, {3, 2}, ids);
    check_grad<Z>(g, {3, 2, 7}, 69, [&](const Z& z) { return weighted_sum(nn::softmax_cross_entropy<vocab>(z, labels, 0.1), 42); }, 2);
    auto z = mt::random_normal<Z>(g, {3, 2, 7}, 70, 0, 3);
    const auto hz = mt::gather_all(z);
    const auto loss = mt::gather_all(nn::softmax_cross_entropy<vocab>(z, labels));
    for (std::size_t r = 0; r < 6; ++r) {
      double s = 0;
      for (std::size_t v = 0; v < 7; ++v) s += std::exp(hz[r * 7 + v]);
      REQUIRE(std::abs(loss[r] - (std::log(s) - hz[r * 7 + ids[r]])) < 1e-12);
    }

    using XF = mt::tensor<double, L, batch, d_model>;
    using W1 = mt::tensor<double, L, d_model, d_ff>;
    using W2 = mt::tensor<double, L, d_ff, d_model>;
    auto w1 = nn::normal_fan_in<W1, d_model>(g, {7, 5}, 71);
    auto w2 = nn::normal_fan_in<W2, d_ff>(g, {5, 7}, 72);
    check_grad<XF>(g, {3, 7}, 73, [&](const XF& x) { return weighted_sum(nn::feed_forward<d_model, d_ff>(x, w1, w2), 55); }, 2);
  });
}
