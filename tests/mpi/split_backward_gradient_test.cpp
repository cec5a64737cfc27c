// The backward pass split into input gradients (B) and weight gradients (W)
// (autodiff/split_backward.hpp), on a Transformer block with an embedding, layer norm, attention
// and a biased feed-forward, under four layouts: B gives the input's gradient before any weight's
// is computed; B then W gives the gradients of one backward pass; two microbatches' Bs and Ws in
// a zero-bubble order (B1 B2 W2 W1) give the gradient of their sum; a weight used through an op
// (scaled) is deferred too; the collectives equal the unsplit pass's; a plan reports W's products
// apart and the FLOPs of B and W add up to the unsplit backward pass's.
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/autodiff/split_backward.hpp>
#include <meshtensor/nn/attention.hpp>
#include <meshtensor/nn/embedding.hpp>
#include <meshtensor/nn/layer_norm.hpp>
#include <test_support.hpp>

#include "transformer_dims.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
using layouts = list<mt::layout<grid>, mt::layout<grid, mt::split<batch, r_>, mt::split<heads, c_>, mt::split<d_ff, c_>>,
                     mt::layout<grid, mt::split<heads, r_, c_>, mt::split<vocab, r_, c_>>,
                     mt::layout<grid, mt::split<d_model, r_>, mt::split<length, c_>>>;

// Extents that 2, 3, 4 and 6 processors split unevenly somewhere.
template <class L>
struct block {
  using X = mt::tensor<double, L, batch, length, d_model>;
  using Ids = mt::tensor<int, L, batch, length>;
  using Table = mt::tensor<double, L, vocab, d_model>;
  using S = mt::tensor<double, L, d_model>;
  using W = mt::tensor<double, L, d_model, heads, d_kv>;
  using WO = mt::tensor<double, L, heads, d_kv, d_model>;
  using W1 = mt::tensor<double, L, d_model, d_ff>;
  using B1 = mt::tensor<double, L, d_ff>;
  using W2 = mt::tensor<double, L, d_ff, d_model>;
  static constexpr std::int64_t B = 3, N = 5, D = 6, H = 4, K = 3, F = 7, V = 9;

  Table table;
  S scale, bias;
  W wq, wk, wv;
  WO wo;
  W1 w1;
  B1 b1;
  W2 w2;

  explicit block(const grid& g)
      : table(mt::random_normal<Table>(g, {V, D}, 1)),
        scale(mt::random_uniform<S>(g, {D}, 2, 0.5, 1.5)),
        bias(mt::random_normal<S>(g, {D}, 3)),
        wq(mt::random_normal<W>(g, {D, H, K}, 4, 0, 0.5)),
        wk(mt::random_normal<W>(g, {D, H, K}, 5, 0, 0.5)),
        wv(mt::random_normal<W>(g, {D, H, K}, 6, 0, 0.5)),
        wo(mt::random_normal<WO>(g, {H, K, D}, 7, 0, 0.5)),
        w1(mt::random_normal<W1>(g, {D, F}, 8, 0, 0.5)),
        b1(mt::random_normal<B1>(g, {F}, 9)),
        w2(mt::random_normal<W2>(g, {F, D}, 10, 0, 0.5)) {
    std::apply([](auto&... p) { (p.requires_grad(), ...); }, weights());
  }
  auto weights() { return std::tie(table, scale, bias, wq, wk, wv, wo, w1, b1, w2); }

  static X input(const grid& g, std::uint64_t seed) { return mt::random_normal<X>(g, {B, N, D}, seed); }
  // The loss of microbatch `seed` for the stage input x (a leaf, as a pipeline stage's).
  mt::tensor<double, L> loss(const X& x, std::uint64_t seed) const {
    std::vector<int> ids(static_cast<std::size_t>(B * N));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 7 + seed) % V);
    const X h = x + nn::embedding<vocab>(table, mt::from_host<Ids>(x.mesh(), {B, N}, ids));
    const X a = h + nn::causal_attention<length, mlen, d_model, heads, d_kv>(nn::layer_norm<d_model>(h, scale, bias), wq,
                                                                            wk, wv, wo);
    const auto u = mt::relu(mt::einsum<batch, length, d_ff>(a, w1) + b1);
    // w2 scaled: a node computed from a weight alone, whose product W computes too (as a bf16
    // working copy's).
    return weighted_sum(X(a + mt::einsum<batch, length, d_model>(u, W2(w2 * 0.5))), 100 + seed);
  }
};

template <class... Ts>
std::vector<std::vector<double>> gathered(const std::tuple<Ts...>& ts) {
  return std::apply([](const auto&... t) { return std::vector<std::vector<double>>{mt::gather_all(t)...}; }, ts);
}
void require_all_close(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("weight " << i);
    require_close(got[i], want[i], 1e-12);
  }
}
}  // namespace

TEST_CASE("B then W gives one backward pass's gradients, under every layout", "[gradient]") {
  const auto g = world_grid();
  for_each_type(layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using K = block<L>;
    K m(g);
    auto x = K::input(g, 20).requires_grad();

    auto want = std::apply([&](auto&... w) { return mt::gradient(m.loss(x, 1), x, w...); }, m.weights());
    const auto want_x = mt::gather_all(std::get<0>(want));
    const auto want_w = gathered(std::apply([](const auto&, const auto&... w) { return std::tie(w...); }, want));

    auto pass = std::apply([&](auto&... w) { return mt::accumulate_input_gradient(m.loss(x, 1), std::tie(x), w...); },
                           m.weights());
    // Every weight's work is waiting: six products (q, k, v, o and the feed-forward's two), the
    // embedding's table, layer norm's scale and bias (one computation where it is fused, two sums
    // where d_model is split: scale times and bias plus), the bias of d_ff.
    constexpr bool norm_fused = mt::detail::axes_mask_of<typename K::X, mt::type_list<d_model>>() == 0;
    CHECK(pass.pending() == (norm_fused ? 9u : 10u));
    {
      const auto [dx] = mt::take_gradients(x);
      require_close(mt::gather_all(dx), want_x, 1e-12);
    }
    pass.run();
    CHECK(pass.pending() == 0);
    require_all_close(gathered(std::apply([](auto&... w) { return mt::take_gradients(w...); }, m.weights())), want_w);
  });
}

TEST_CASE("two microbatches in a zero-bubble order (B1 B2 W2 W1) give the gradient of their sum", "[gradient]") {
  const auto g = world_grid();
  for_each_type(layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using K = block<L>;
    K m(g);
    auto x1 = K::input(g, 21).requires_grad(), x2 = K::input(g, 22).requires_grad();
    using Loss = mt::tensor<double, L>;
    const auto want = gathered(
        std::apply([&](auto&... w) { return mt::gradient(Loss(m.loss(x1, 1) + m.loss(x2, 2)), w...); }, m.weights()));
    const auto [want_x1] = mt::gradient(m.loss(x1, 1), x1);
    const auto [want_x2] = mt::gradient(m.loss(x2, 2), x2);

    const auto input_pass = [&](const typename K::X& x, std::uint64_t mb) {
      return std::apply([&](auto&... w) { return mt::accumulate_input_gradient(m.loss(x, mb), std::tie(x), w...); },
                        m.weights());
    };
    auto w1 = input_pass(x1, 1);
    auto w2 = input_pass(x2, 2);
    const auto [dx1, dx2] = mt::take_gradients(x1, x2);
    require_close(mt::gather_all(dx1), mt::gather_all(want_x1), 1e-12);
    require_close(mt::gather_all(dx2), mt::gather_all(want_x2), 1e-12);
    w2.run();
    w1.run();
    require_all_close(gathered(std::apply([](auto&... w) { return mt::take_gradients(w...); }, m.weights())), want);
  });
}

TEST_CASE("the split pass sends what the unsplit one sends", "[gradient]") {
  const auto g = world_grid();
  for_each_type(layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using K = block<L>;
    K m(g);
    auto x = K::input(g, 23).requires_grad();
    const auto loss_a = m.loss(x, 3);
    g.reset_counters();
    std::apply([&](auto&... w) { mt::accumulate_gradient(loss_a, x, w...); }, m.weights());
    (void)mt::take_gradients(x);
    (void)std::apply([](auto&... w) { return mt::take_gradients(w...); }, m.weights());
    const auto unsplit = g.counters();

    const auto loss_b = m.loss(x, 3);
    g.reset_counters();
    auto pass = std::apply([&](auto&... w) { return mt::accumulate_input_gradient(loss_b, std::tie(x), w...); },
                           m.weights());
    (void)mt::take_gradients(x);
    pass.run();
    (void)std::apply([](auto&... w) { return mt::take_gradients(w...); }, m.weights());
    INFO("split: " << show(g.counters()) << " unsplit: " << show(unsplit));
    REQUIRE(g.counters() == unsplit);  // calls and bytes
  });
}

TEST_CASE("a plan counts B and W apart, and their FLOPs add up to one backward pass's", "[gradient]") {
  const auto real = world_grid();
  using L = mt::layout<grid, mt::split<batch, r_>, mt::split<heads, c_>, mt::split<d_ff, c_>>;
  using K = block<L>;
  const auto backward_flops = [](const mt::plan_report& r, const char* suffix) {
    std::int64_t f = 0;
    for (const auto& row : r.flops)
      if (row.op.ends_with(suffix)) f += row.flops;
    return f;
  };
  std::int64_t unsplit = 0;
  {
    const auto g = grid::planned(real.sizes(), {real.coord<r_>(), real.coord<c_>()});
    K m(g);
    auto x = K::input(g, 24).requires_grad();
    std::apply([&](auto&... w) { mt::accumulate_gradient(m.loss(x, 4), x, w...); }, m.weights());
    const auto report = mt::plan_report_of(g);
    unsplit = backward_flops(report, " (backward)");
    CHECK(backward_flops(report, " (weight gradient)") == 0);
  }
  const auto g = grid::planned(real.sizes(), {real.coord<r_>(), real.coord<c_>()});
  K m(g);
  auto x = K::input(g, 24).requires_grad();
  auto pass = std::apply([&](auto&... w) { return mt::accumulate_input_gradient(m.loss(x, 4), std::tie(x), w...); },
                         m.weights());
  pass.run();
  const auto report = mt::plan_report_of(g);
  const auto b = backward_flops(report, " (backward)"), w = backward_flops(report, " (weight gradient)");
  INFO("B " << b << " W " << w << " unsplit " << unsplit);
  CHECK(w > 0);
  CHECK(b + w == unsplit);
  bool einsum_w = false;
  for (const auto& row : report.flops) einsum_w = einsum_w || row.op == "einsum (weight gradient)";
  CHECK(einsum_w);
}

TEST_CASE("accumulate_input_gradient refuses a tensor given as input and weight", "[gradient]") {
  const auto g = world_grid();
  using K = block<mt::layout<grid>>;
  K m(g);
  auto x = K::input(g, 25).requires_grad();
  // Named by its type and extents, as the other refusals name a tensor.
  const std::string named = "tensor<batch, length, d_model>[batch=" + std::to_string(K::B) + ", length=" + std::to_string(K::N) +
                            ", d_model=" + std::to_string(K::D) + "] is given both as an input and as a weight";
  REQUIRE_THROWS_WITH((void)mt::accumulate_input_gradient(m.loss(x, 5), std::tie(x), m.w1, x),
                      Catch::Matchers::ContainsSubstring(named));
}
