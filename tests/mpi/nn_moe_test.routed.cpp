// nn::routed_moe: outputs, balance loss and loads equal a plain loop over tokens written here (top-k
// over eight experts steered by a bias, softmax or sigmoid scores, capacity in routing order or
// dropless, SwiGLU experts, shared experts) under every layout below; the collectives counted equal
// routed_moe_plan, one alltoall each way where experts are split as groups are; gradients of x and
// of every weight equal central differences; update_router_bias moves toward the mean load and
// evens a skewed router's load; the ragged dispatch inside pipeline stages equals one processor.
#include <algorithm>
#include <array>
#include <map>
#include <vector>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/nn/routed_moe.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
struct group : mt::dim<"group"> {};
struct token : mt::dim<"token"> {};
struct d_model : mt::dim<"d_model"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct experts : mt::dim<"experts"> {};
using dims = nn::moe_dims<group, token, d_model, d_ff, experts>;
using EU = dims::experts_unsplit;

constexpr std::int64_t G = 4, S = 5, M = 4, F = 3, E = 8, K = 3;

using L_rep = mt::layout<grid>;
using L_ge_r = mt::layout<grid, mt::split<group, r_>, mt::split<experts, r_>>;
using L_ge_r_ff_c = mt::layout<grid, mt::split<group, r_>, mt::split<experts, r_>, mt::split<d_ff, c_>>;
using L_ge_r_model_c = mt::layout<grid, mt::split<group, r_>, mt::split<experts, r_>, mt::split<d_model, c_>>;
using L_ge_rc = mt::layout<grid, mt::split<group, r_, c_>, mt::split<experts, r_, c_>>;
using all_layouts = list<L_rep, L_ge_r, L_ge_r_ff_c, L_ge_r_model_c, L_ge_rc>;

template <class L>
struct model {
  using X = mt::tensor<double, L, group, token, d_model>;
  using WR = mt::tensor<double, L, d_model, EU>;
  using B = mt::tensor<double, L, EU>;
  using WI = mt::tensor<double, L, experts, d_model, d_ff>;
  using WO = mt::tensor<double, L, experts, d_ff, d_model>;
  using W1 = mt::tensor<double, L, d_model, d_ff>;
  using W2 = mt::tensor<double, L, d_ff, d_model>;
  static constexpr typename X::extents_type ex{G, S, M};
  static constexpr typename WR::extents_type er{M, E};
  static constexpr typename B::extents_type eb{E};
  static constexpr typename WI::extents_type ei{E, M, F};
  static constexpr typename WO::extents_type eo{E, F, M};
  static constexpr typename W1::extents_type e1{M, F};
  static constexpr typename W2::extents_type e2{F, M};
  X x;
  WR wr;
  B bias;
  WI wg, wu;
  WO wd;
  W1 sg, su;
  W2 sd;
  explicit model(const grid& g)
      : x(mt::random_normal<X>(g, ex, 1)),
        wr(mt::random_normal<WR>(g, er, 2)),
        bias(mt::random_normal<B>(g, eb, 3, 0, 0.3)),
        wg(mt::random_normal<WI>(g, ei, 4)),
        wu(mt::random_normal<WI>(g, ei, 5)),
        wd(mt::random_normal<WO>(g, eo, 6)),
        sg(mt::random_normal<W1>(g, e1, 7)),
        su(mt::random_normal<W1>(g, e1, 8)),
        sd(mt::random_normal<W2>(g, e2, 9)) {}
  nn::shared_experts<W1, W2> shared() const { return {sg, su, sd}; }
};

struct host_weights {
  std::vector<double> x, wr, bias, wg, wu, wd, sg, su, sd;
  template <class L>
  explicit host_weights(const model<L>& m)
      : x(mt::gather_all(m.x)), wr(mt::gather_all(m.wr)), bias(mt::gather_all(m.bias)), wg(mt::gather_all(m.wg)),
        wu(mt::gather_all(m.wu)), wd(mt::gather_all(m.wd)), sg(mt::gather_all(m.sg)), su(mt::gather_all(m.su)),
        sd(mt::gather_all(m.sd)) {}
};

struct reference_result {
  std::vector<double> y;
  double aux = 0;
  std::vector<double> load = std::vector<double>(E), routed = std::vector<double>(E);
};

double silu(double v) { return v / (1 + std::exp(-v)); }

// The layer as a loop over tokens, from the global (row-major) tensors.
reference_result reference(const host_weights& w, const nn::routed_moe_options& o, bool with_shared) {
  reference_result r;
  r.y.assign(G * S * M, 0.0);
  const std::int64_t capacity = o.capacity == 0 ? S : o.capacity;
  const auto xs = [&](std::int64_t g, std::int64_t s, std::int64_t m) { return w.x[(g * S + s) * M + m]; };
  for (std::int64_t g = 0; g < G; ++g) {
    std::vector<std::array<double, E>> score(S);
    std::vector<std::array<std::int64_t, K>> pick(S);
    std::vector<std::array<double, K>> weight(S);
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t e = 0; e < E; ++e) {
        double l = 0;
        for (std::int64_t m = 0; m < M; ++m) l += xs(g, s, m) * w.wr[m * E + e];
        score[s][e] = l;
      }
      if (o.scores == nn::router_scores::softmax) {
        const double mx = *std::max_element(score[s].begin(), score[s].end());
        double z = 0;
        for (auto& v : score[s]) z += (v = std::exp(v - mx));
        for (auto& v : score[s]) v /= z;
      } else {
        for (auto& v : score[s]) v = 1 / (1 + std::exp(-v));
      }
      std::array<bool, E> taken{};
      double sum = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        std::int64_t best = -1;
        for (std::int64_t e = 0; e < E; ++e)
          if (!taken[e] && (best < 0 || score[s][e] + w.bias[e] > score[s][best] + w.bias[best])) best = e;
        taken[best] = true;
        pick[s][j] = best;
        weight[s][j] = score[s][best];
        sum += score[s][best];
      }
      for (auto& v : weight[s]) v = (o.normalize_weights ? v / sum : v) * o.weight_scale;
    }
    std::array<std::int64_t, E> filled{};
    for (std::int64_t j = 0; j < K; ++j)
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t e = pick[s][j];
        r.load[e] += 1;
        if (filled[e]++ >= capacity) continue;
        r.routed[e] += 1;
        for (std::int64_t f = 0; f < F; ++f) {
          double a = 0, b = 0;
          for (std::int64_t m = 0; m < M; ++m) {
            a += xs(g, s, m) * w.wg[(e * M + m) * F + f];
            b += xs(g, s, m) * w.wu[(e * M + m) * F + f];
          }
          for (std::int64_t m = 0; m < M; ++m)
            r.y[(g * S + s) * M + m] += weight[s][j] * silu(a) * b * w.wd[(e * F + f) * M + m];
        }
      }
    if (with_shared)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t f = 0; f < F; ++f) {
          double a = 0, b = 0;
          for (std::int64_t m = 0; m < M; ++m) {
            a += xs(g, s, m) * w.sg[m * F + f];
            b += xs(g, s, m) * w.su[m * F + f];
          }
          for (std::int64_t m = 0; m < M; ++m) r.y[(g * S + s) * M + m] += silu(a) * b * w.sd[f * M + m];
        }
    // f_e P_e: f_e = E / (K S) times the tokens choosing e; P_e the mean normalised score.
    for (std::int64_t e = 0; e < E; ++e) {
      double chose = 0, p = 0;
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t j = 0; j < K; ++j) chose += pick[s][j] == e;
        double total = 0;
        for (double v : score[s]) total += v;
        p += score[s][e] / total / S;
      }
      r.aux += chose * E / (K * S) * p / G;
    }
  }
  return r;
}

const nn::routed_moe_options mixtral_like{.top_k = K, .capacity = 2};
const nn::routed_moe_options deepseek_like{
    .top_k = K, .scores = nn::router_scores::sigmoid, .normalize_weights = true, .weight_scale = 2.5, .capacity = 0};
}  // namespace

TEST_CASE("routed_moe equals a loop over tokens under every layout", "[nn][moe][routed]") {
  const auto g = world_grid();
  for_each_type(all_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    const model<L> m(g);
    const host_weights w(m);
    {
      INFO("softmax scores, capacity 2, shared experts");
      const auto want = reference(w, mixtral_like, true);
      // The inputs exercise the capacity: some choices are dropped.
      REQUIRE(want.load != want.routed);
      for (const std::int64_t chunks : {1, 2}) {  // capacity 2: one slot per chunk
        INFO("overlap_chunks " << chunks);
        auto o = mixtral_like;
        o.overlap_chunks = chunks;
        const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o, m.shared());
        REQUIRE(max_rel_error(mt::gather_all(r.y), want.y) < 1e-12);
        REQUIRE(std::abs(mt::gather_all(r.aux_loss)[0] - want.aux) < 1e-12);
        REQUIRE(mt::gather_all(r.load) == want.load);
        REQUIRE(mt::gather_all(r.routed) == want.routed);
      }
    }
    {
      INFO("sigmoid scores scaled by 2.5, dropless");
      const auto want = reference(w, deepseek_like, false);
      // Some expert takes more than the capacity-2 run kept: dropless keeps them all.
      REQUIRE(*std::max_element(want.load.begin(), want.load.end()) > 2 * G);
      REQUIRE(want.load == want.routed);
      for (const std::int64_t chunks : {1, 3}) {  // 5 slots (the tokens per group) as 1, 2 and 2
        INFO("overlap_chunks " << chunks);
        auto o = deepseek_like;
        o.overlap_chunks = chunks;
        const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o);
        REQUIRE(max_rel_error(mt::gather_all(r.y), want.y) < 1e-12);
        REQUIRE(std::abs(mt::gather_all(r.aux_loss)[0] - want.aux) < 1e-12);
        REQUIRE(mt::gather_all(r.routed) == want.load);
      }
    }
  });
}

TEST_CASE("routed_moe communicates as routed_moe_plan; experts split where groups were: one alltoall each way",
          "[nn][moe][routed][comm_plan]") {
  const auto g = world_grid();
  for_each_type(all_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    const model<L> m(g);
    g.reset_counters();
    (void)nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, deepseek_like);
    require_counts(g.counters(), nn::routed_moe_plan<dims, typename model<L>::X>().as_counts());
    constexpr unsigned group_axes = L::template split_of<group>().mask();
    if constexpr (group_axes != 0) {
      const auto it = g.counters().find({mt::collective::alltoall, group_axes});
      REQUIRE(it != g.counters().end());
      REQUIRE(it->second.calls == 2);
    }
    g.reset_counters();
    (void)nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, mixtral_like, m.shared());
    require_counts(g.counters(), nn::routed_moe_plan<dims, typename model<L>::X, true>().as_counts());
    // In chunks: the dispatch, the experts, the return and the combine once per chunk.
    g.reset_counters();
    auto chunked = deepseek_like;
    chunked.overlap_chunks = 3;
    (void)nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, chunked);
    require_counts(g.counters(), nn::routed_moe_plan<dims, typename model<L>::X>(3).as_counts());
    if constexpr (group_axes != 0) REQUIRE(g.counters().at({mt::collective::alltoall, group_axes}).calls == 6);
  });
}

TEST_CASE("routed_moe gradients equal central differences", "[nn][moe][routed][gradient]") {
  const auto g = world_grid();
  for_each_type(list<L_rep, L_ge_r_ff_c, L_ge_rc>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using mo = model<L>;
    using X = typename mo::X;
    using WR = typename mo::WR;
    using WI = typename mo::WI;
    using WO = typename mo::WO;
    using W1 = typename mo::W1;
    using W2 = typename mo::W2;
    const mo m(g);
    const host_weights w(m);
    auto loss = [&](const nn::routed_moe_options& o, const X& x, const WR& wr, const WI& wg, const WI& wu, const WO& wd,
                    const W1& sg, const W2& sd) {
      const auto r = nn::routed_moe<dims>(x, wr, m.bias, wg, wu, wd, o, nn::shared_experts<W1, W2>{sg, m.su, sd});
      return weighted_sum(r.y, 11) + r.aux_loss;
    };
    const gradient_check_options every_third{.stride = 3};
    for (const auto& o : {mixtral_like, deepseek_like}) {
      INFO((o.scores == nn::router_scores::softmax ? "softmax, capacity 2" : "sigmoid, dropless"));
      check_gradient<X>(g, mo::ex, w.x, [&](const X& v) { return loss(o, v, m.wr, m.wg, m.wu, m.wd, m.sg, m.sd); },
                        every_third);
      check_gradient<WR>(g, mo::er, w.wr, [&](const WR& v) { return loss(o, m.x, v, m.wg, m.wu, m.wd, m.sg, m.sd); });
    }
    const auto& o = mixtral_like;
    check_gradient<WI>(g, mo::ei, w.wg, [&](const WI& v) { return loss(o, m.x, m.wr, v, m.wu, m.wd, m.sg, m.sd); },
                       every_third);
    check_gradient<WI>(g, mo::ei, w.wu, [&](const WI& v) { return loss(o, m.x, m.wr, m.wg, v, m.wd, m.sg, m.sd); },
                       every_third);
    check_gradient<WO>(g, mo::eo, w.wd, [&](const WO& v) { return loss(o, m.x, m.wr, m.wg, m.wu, v, m.sg, m.sd); },
                       every_third);
    check_gradient<W1>(g, mo::e1, w.sg, [&](const W1& v) { return loss(o, m.x, m.wr, m.wg, m.wu, m.wd, v, m.sd); });
    check_gradient<W2>(g, mo::e2, w.sd, [&](const W2& v) { return loss(o, m.x, m.wr, m.wg, m.wu, m.wd, m.sg, v); });
  });
}

TEST_CASE("update_router_bias moves each expert's bias toward the mean load and evens a skewed router",
          "[nn][moe][routed]") {
  const auto g = world_grid();
  using L = L_ge_r;
  using B = typename model<L>::B;
  // load 12, 4, 8, 8, 6, 10, 8, 8 (mean 8): down, up, level, level, up, down, level, level.
  auto bias = mt::from_host<B>(g, {E}, std::vector<double>(E, 0.5));
  const auto load = mt::from_host<B>(g, {E}, std::vector<double>{12, 4, 8, 8, 6, 10, 8, 8});
  nn::update_router_bias(bias, load, 0.25);
  REQUIRE(mt::gather_all(bias) == std::vector<double>{0.25, 0.75, 0.5, 0.5, 0.75, 0.25, 0.5, 0.5});
  REQUIRE_THROWS_WITH(nn::update_router_bias(bias, load, -1.0),
                      Catch::Matchers::ContainsSubstring("update_router_bias: rate must be >= 0; got -1"));

  // A router whose first expert every token chooses: the bias alone evens the load.
  model<L> m(g);
  m.x = mt::abs(m.x);
  m.wr = mt::from_host<typename model<L>::WR>(g, model<L>::er, [&] {
    auto v = mt::gather_all(m.wr);
    for (std::int64_t r = 0; r < M; ++r) v[r * E] = 4.0;
    return v;
  }());
  m.bias = mt::full<B>(g, {E}, 0.0);
  const auto spread = [&] {
    const auto l = mt::gather_all(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, deepseek_like).load);
    return *std::max_element(l.begin(), l.end()) - *std::min_element(l.begin(), l.end());
  };
  const double before = spread();
  INFO("spread of the load before: " << before);
  REQUIRE(before >= G * S);  // expert 0 chosen by every token, some expert by none
  for (int step = 0; step < 40; ++step)
    nn::update_router_bias(m.bias, nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, deepseek_like).load, 0.02);
  // An even split is 20 tokens x 3 choices / 8 experts = 7.5 each.
  const double after = spread();
  INFO("after: " << after);
  REQUIRE(after <= 4);
}

TEST_CASE("routed_capacity_for: factor times an even share of the choices, within [min_capacity, tokens]",
          "[nn][moe][routed]") {
  REQUIRE(nn::routed_capacity_for(20, 8, 3) == 10);        // ceil(3 x 20 x 1.25 / 8) = ceil(9.375)
  REQUIRE(nn::routed_capacity_for(4096, 256, 8, 1.0) == 128);
  REQUIRE(nn::routed_capacity_for(16, 64, 2) == 4);        // ceil(0.625), raised to min_capacity
  REQUIRE(nn::routed_capacity_for(6, 2, 2, 2.0) == 6);     // 12, at most the tokens
}

TEST_CASE("routed_moe refuses top_k beyond the experts, naming the extents", "[nn][moe][routed]") {
  const auto g = world_grid();
  const model<L_rep> m(g);
  REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, {.top_k = E + 1}),
                      Catch::Matchers::ContainsSubstring("1 <= top_k <= experts") &&
                          Catch::Matchers::ContainsSubstring("experts_unsplit = 8 in w_router") &&
                          Catch::Matchers::ContainsSubstring("top_k = 9"));
}

TEST_CASE("routed_moe in chunks: the gradients of the whole layer's", "[nn][moe][routed][gradient]") {
  const auto g = world_grid();
  for_each_type(list<L_ge_r_ff_c, L_ge_rc>{}, [&]<class L>() {
    INFO(layout_name<L>());
    model<L> m(g);
    m.x.requires_grad();
    m.wr.requires_grad();
    m.wg.requires_grad();
    m.wu.requires_grad();
    m.wd.requires_grad();
    const auto grads = [&](std::int64_t chunks) {
      auto o = mixtral_like;
      o.capacity = 3;
      o.overlap_chunks = chunks;
      const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o, m.shared());
      const auto [gx, gr, gg, gu, gd] = mt::gradient(weighted_sum(r.y, 11) + r.aux_loss, m.x, m.wr, m.wg, m.wu, m.wd);
      return std::array{mt::gather_all(gx), mt::gather_all(gr), mt::gather_all(gg), mt::gather_all(gu),
                        mt::gather_all(gd)};
    };
    const auto whole = grads(1), chunked = grads(2);
    for (std::size_t i = 0; i < whole.size(); ++i) {
      INFO("gradient " << i << " of x, w_router, w_gate, w_up, w_down");
      REQUIRE(max_rel_error(chunked[i], whole[i]) < 1e-12);
    }
  });
}

// The backward pass mirrors the forward's overlap: the gradient of each chunk's return and dispatch
// goes back by an alltoall started where the pass reaches the chunk's wait and landed where it
// reaches the chunk's start, so each is in flight while another chunk's products run (a plan's
// events: every alltoall started and waited, none blocking; each of the backward's four has
// products between its start and its wait). Counted: two alltoalls per chunk each way.
TEST_CASE("routed_moe in chunks: the backward pass's alltoalls run behind the experts' products",
          "[nn][moe][routed][gradient][comm_plan]") {
  const auto g = world_grid();
  for_each_type(list<L_ge_r, L_ge_rc>{}, [&]<class L>() {
    INFO(layout_name<L>());
    constexpr unsigned group_axes = L::template split_of<group>().mask();
    const auto step = [&](const grid& on) {
      model<L> m(on);
      m.x.requires_grad();
      m.wg.requires_grad();
      m.wu.requires_grad();
      m.wd.requires_grad();
      on.reset_counters();
      if (on.is_planned()) mt::reset_plan(on);
      auto o = mixtral_like;
      o.capacity = 3;
      o.overlap_chunks = 2;
      const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o);
      (void)mt::gradient(weighted_sum(r.y, 11) + r.aux_loss, m.x, m.wg, m.wu, m.wd);
      REQUIRE(on.counters().at({mt::collective::alltoall, group_axes}).calls == 8);
    };
    step(g);
    {  // a planned mesh in a scope of its own
      const grid planned = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
      step(planned);
      const auto events = mt::plan_report_of(planned).timeline.events;
      std::map<std::int64_t, std::pair<std::size_t, std::size_t>> started_waited;  // by ticket
      for (std::size_t e = 0; e < events.size(); ++e) {
        if (events[e].op != mt::collective::alltoall || events[e].axes != mt::axis_set{group_axes}) continue;
        REQUIRE(events[e].kind != mt::plan_event_kind::blocking);
        auto& [start, wait] = started_waited[events[e].ticket];
        (events[e].kind == mt::plan_event_kind::started ? start : wait) = e;
      }
      REQUIRE(started_waited.size() == 8);
      std::vector<std::pair<std::size_t, std::size_t>> in_order;
      for (const auto& [ticket, sw] : started_waited) in_order.push_back(sw);
      std::sort(in_order.begin(), in_order.end());
      for (std::size_t i = 4; i < in_order.size(); ++i) {
        INFO("the backward pass's alltoall " << i - 4 << " (in the order they start)");
        const auto [start, wait] = in_order[i];
        bool products_between = false;
        for (std::size_t e = start + 1; e <= wait; ++e) products_between |= !events[e].before.products.empty();
        REQUIRE(products_between);
      }
    }
  });
}

TEST_CASE("routed_moe refuses more chunks than an expert's buffer has slots", "[nn][moe][routed]") {
  const auto g = world_grid();
  const model<L_ge_r> m(g);
  for (const std::int64_t chunks : {0, 3}) {
    auto o = mixtral_like;  // capacity 2
    o.overlap_chunks = chunks;
    REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o),
                        Catch::Matchers::ContainsSubstring(mt::detail::cat("overlap_chunks = ", chunks)) &&
                            Catch::Matchers::ContainsSubstring("buffer of 2 slots (dim 'expert_capacity')") &&
                            Catch::Matchers::ContainsSubstring("give 1 (no overlap) to 2"));
  }
}

// The ragged dispatch (dropless): each (token, choice) row sent to its expert's processor, the
// experts' rows one product each. Experts split over rows alone beside groups over rows and cols
// (data parallelism over cols): the weights' gradients are partial sums the tape reduces. d_ff over
// cols beside groups and experts over rows (expert tensor parallelism): the experts' results and
// x's gradient are partial sums over cols, allreduced.
namespace {
using L_g_rc_e_r = mt::layout<grid, mt::split<group, r_, c_>, mt::split<experts, r_>>;
using ragged_layouts = list<L_rep, L_ge_r, L_ge_rc, L_g_rc_e_r, L_ge_r_ff_c>;
constexpr auto ragged = nn::moe_dispatch::ragged;
nn::routed_moe_options ragged_of(nn::routed_moe_options o) {
  o.capacity = 0;
  o.dispatch = ragged;
  return o;
}
}  // namespace

TEST_CASE("routed_moe's ragged dispatch equals the loop over tokens and communicates as planned",
          "[nn][moe][routed][ragged][comm_plan]") {
  const auto g = world_grid();
  for_each_type(ragged_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    const model<L> m(g);
    const host_weights w(m);
    for (const auto& o : {ragged_of(mixtral_like), ragged_of(deepseek_like)}) {
      const bool shared = o.scores == nn::router_scores::softmax;
      INFO((shared ? "softmax scores, shared experts" : "sigmoid scores scaled by 2.5"));
      const auto want = reference(w, o, shared);
      g.reset_counters();
      const auto r = shared ? nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o, m.shared())
                            : nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o);
      const auto counted = g.counters();
      REQUIRE(max_rel_error(mt::gather_all(r.y), want.y) < 1e-12);
      REQUIRE(std::abs(mt::gather_all(r.aux_loss)[0] - want.aux) < 1e-12);
      REQUIRE(mt::gather_all(r.load) == want.load);
      REQUIRE(mt::gather_all(r.routed) == want.load);
      const auto plan = shared ? nn::routed_moe_plan<dims, typename model<L>::X, true>(1, ragged)
                               : nn::routed_moe_plan<dims, typename model<L>::X>(1, ragged);
      require_counts(counted, plan.as_counts());
      // The counts, the rows out and the rows back: three alltoalls over the experts' axes.
      constexpr unsigned expert_axes = L::template split_of<experts>().mask();
      if constexpr (expert_axes != 0) REQUIRE(counted.at({mt::collective::alltoall, expert_axes}).calls == 3);
      // d_ff split: the experts' results summed over its axes, once (the shared experts' product too).
      constexpr unsigned width_axes = L::template split_of<d_ff>().mask();
      if constexpr (width_axes != 0) REQUIRE(counted.at({mt::collective::allreduce, width_axes}).calls == (shared ? 2 : 1));
    }
  });
}

TEST_CASE("routed_moe's ragged dispatch: gradients equal central differences", "[nn][moe][routed][ragged][gradient]") {
  const auto g = world_grid();
  for_each_type(list<L_ge_r, L_g_rc_e_r, L_ge_r_ff_c>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using mo = model<L>;
    using X = typename mo::X;
    using WR = typename mo::WR;
    using WI = typename mo::WI;
    using WO = typename mo::WO;
    const mo m(g);
    const host_weights w(m);
    const auto o = ragged_of(deepseek_like);
    auto loss = [&](const X& x, const WR& wr, const WI& wg, const WI& wu, const WO& wd) {
      const auto r = nn::routed_moe<dims>(x, wr, m.bias, wg, wu, wd, o);
      return weighted_sum(r.y, 11) + r.aux_loss;
    };
    const gradient_check_options every_third{.stride = 3};
    check_gradient<X>(g, mo::ex, w.x, [&](const X& v) { return loss(v, m.wr, m.wg, m.wu, m.wd); }, every_third);
    check_gradient<WR>(g, mo::er, w.wr, [&](const WR& v) { return loss(m.x, v, m.wg, m.wu, m.wd); });
    check_gradient<WI>(g, mo::ei, w.wg, [&](const WI& v) { return loss(m.x, m.wr, v, m.wu, m.wd); }, every_third);
    check_gradient<WI>(g, mo::ei, w.wu, [&](const WI& v) { return loss(m.x, m.wr, m.wg, v, m.wd); }, every_third);
    check_gradient<WO>(g, mo::eo, w.wd, [&](const WO& v) { return loss(m.x, m.wr, m.wg, m.wu, v); }, every_third);
  });
}

// A plan counts what a run of the ragged dispatch calls, forward and backward (the rows' gradients
// to the experts and x's back: five alltoalls in all), though it cannot know the routing.
TEST_CASE("routed_moe's ragged dispatch: a planned step calls what a run calls", "[nn][moe][routed][ragged][comm_plan]") {
  const auto g = world_grid();
  using L = L_ge_rc;
  constexpr unsigned expert_axes = L::template split_of<experts>().mask();
  const auto step = [&](const grid& on) {
    model<L> m(on);
    m.x.requires_grad();
    m.wg.requires_grad();
    m.wd.requires_grad();
    on.reset_counters();
    const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, ragged_of(deepseek_like));
    (void)mt::gradient(weighted_sum(r.y, 11) + r.aux_loss, m.x, m.wg, m.wd);
    return on.counters();
  };
  const auto ran = step(g);
  REQUIRE(ran.at({mt::collective::alltoall, expert_axes}).calls == 5);
  const grid planned = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
  const auto counted = step(planned);
  REQUIRE(counted.size() == ran.size());
  for (const auto& [key, count] : ran) REQUIRE(counted.at(key).calls == count.calls);
}

// In chunks (each processor's experts cut into overlap_chunks, chunk c + 1's rows out and chunk
// c - 1's rows back in flight while chunk c's experts compute, forward and backward): the unchunked
// layer's outputs and gradients, 1 + 2 n alltoalls forward (n allreduces over d_ff's axes) as its
// plan says, every row exchange started and waited with products between for some, and the rows'
// bytes the plan counts equal the run's summed over the ranks (which chunk a row goes in is data).
TEST_CASE("routed_moe's ragged dispatch in chunks: the unchunked layer's results, its exchanges behind the products",
          "[nn][moe][routed][ragged][gradient][comm_plan]") {
  const auto g = world_grid();
  for_each_type(list<L_rep, L_ge_r, L_ge_r_ff_c, L_ge_rc>{}, [&]<class L>() {
    INFO(layout_name<L>());
    constexpr unsigned expert_axes = L::template split_of<experts>().mask();
    constexpr unsigned width_axes = L::template split_of<d_ff>().mask();
    const auto step = [&](const grid& on, std::int64_t chunks) {
      model<L> m(on);
      m.x.requires_grad();
      m.wr.requires_grad();
      m.wg.requires_grad();
      m.wu.requires_grad();
      m.wd.requires_grad();
      on.reset_counters();
      if (on.is_planned()) mt::reset_plan(on);
      auto o = ragged_of(deepseek_like);
      o.overlap_chunks = chunks;
      const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o);
      const auto forward = on.counters();
      const auto [gx, gr, gg, gu, gd] = mt::gradient(weighted_sum(r.y, 11) + r.aux_loss, m.x, m.wr, m.wg, m.wu, m.wd);
      const auto whole_step = on.counters();  // before the gathers below
      std::vector<std::vector<double>> got;
      if (!on.is_planned())
        got = {mt::gather_all(r.y), mt::gather_all(gx), mt::gather_all(gr), mt::gather_all(gg), mt::gather_all(gu),
               mt::gather_all(gd)};
      return std::tuple(got, forward, whole_step);
    };
    const auto [whole, whole_forward, whole_step] = step(g, 1);
    const std::int64_t chunks = 2;
    const auto [chunked, forward, counted] = step(g, chunks);
    for (std::size_t i = 0; i < whole.size(); ++i) {
      INFO("y, then the gradients of x, w_router, w_gate, w_up, w_down: " << i);
      REQUIRE(max_rel_error(chunked[i], whole[i]) < 1e-12);
    }
    require_counts(forward, nn::routed_moe_plan<dims, typename model<L>::X>(chunks, ragged).as_counts());
    if constexpr (expert_axes != 0) {
      REQUIRE(forward.at({mt::collective::alltoall, expert_axes}).calls == 1 + 2 * chunks);
      REQUIRE(counted.at({mt::collective::alltoall, expert_axes}).calls == 1 + 4 * chunks);  // and 2 n backward
    }
    if constexpr (width_axes != 0) REQUIRE(counted.at({mt::collective::allreduce, width_axes}).calls == 2 * chunks);
    const grid planned = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
    const auto [none, planned_forward, planned_step] = step(planned, chunks);
    REQUIRE(planned_step.size() == counted.size());
    for (const auto& [key, count] : counted) REQUIRE(planned_step.at(key).calls == count.calls);
    std::int64_t routed[2] = {0, 0};  // run, plan: summed over the ranks
    for (const auto& [key, count] : counted) routed[0] += count.routed_bytes;
    for (const auto& [key, count] : planned_step) routed[1] += count.routed_bytes;
    MPI_Allreduce(MPI_IN_PLACE, routed, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    REQUIRE(routed[0] == routed[1]);
    if constexpr (expert_axes != 0) {
      // The rows' exchanges (all but the counts' one) started and waited, products between some.
      const auto events = mt::plan_report_of(planned).timeline.events;
      std::map<std::int64_t, std::pair<std::size_t, std::size_t>> started_waited;  // by ticket
      std::size_t blocking = 0;
      for (std::size_t e = 0; e < events.size(); ++e) {
        if (events[e].op != mt::collective::alltoall || events[e].axes != mt::axis_set{expert_axes}) continue;
        if (events[e].kind == mt::plan_event_kind::blocking) {
          ++blocking;
          continue;
        }
        auto& [start, wait] = started_waited[events[e].ticket];
        (events[e].kind == mt::plan_event_kind::started ? start : wait) = e;
      }
      REQUIRE(blocking == 1);
      REQUIRE(started_waited.size() == static_cast<std::size_t>(4 * chunks));
      std::size_t behind_products = 0;
      for (const auto& [ticket, sw] : started_waited) {
        bool products_between = false;
        for (std::size_t e = sw.first + 1; e <= sw.second; ++e) products_between |= !events[e].before.products.empty();
        behind_products += products_between;
      }
      // Forward and backward: chunk 1's rows out behind chunk 0's products, chunk 0's back behind chunk 1's.
      REQUIRE(behind_products >= 4);
    }
  });
}

TEST_CASE("routed_moe's ragged dispatch refuses more chunks than a processor has experts, by name",
          "[nn][moe][routed][ragged]") {
  const auto g = world_grid();
  using L = L_ge_rc;
  const model<L> m(g);
  const std::int64_t held = E / g.communicator().size_over(mt::axis_set{L::template split_of<experts>().mask()});
  for (const std::int64_t chunks : {std::int64_t{0}, held + 1}) {
    auto o = ragged_of(deepseek_like);
    o.overlap_chunks = chunks;
    REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o),
                        Catch::Matchers::ContainsSubstring(mt::detail::cat("overlap_chunks = ", chunks)) &&
                            Catch::Matchers::ContainsSubstring(mt::detail::cat("a processor holds ", held, " of the 8 experts")) &&
                            Catch::Matchers::ContainsSubstring(mt::detail::cat("give 1 (no overlap) to ", held)));
  }
}

TEST_CASE("routed_moe's ragged dispatch refuses a capacity and layouts it cannot serve, by name",
          "[nn][moe][routed][ragged]") {
  const auto g = world_grid();
  {
    const model<L_ge_r> m(g);
    auto o = ragged_of(mixtral_like);
    o.capacity = 2;
    REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, o),
                        Catch::Matchers::ContainsSubstring("the ragged dispatch is dropless: it needs capacity = 0; got capacity = 2"));
  }
  {  // experts over cols, groups over rows: a token's experts lie where its group is not
    using L_g_r_e_c = mt::layout<grid, mt::split<group, r_>, mt::split<experts, c_>>;
    const model<L_g_r_e_c> m(g);
    REQUIRE_THROWS_AS(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, ragged_of(deepseek_like)), mt::layout_error);
    REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, ragged_of(deepseek_like)),
                        Catch::Matchers::ContainsSubstring("the ragged dispatch") &&
                            Catch::Matchers::ContainsSubstring("it needs 'experts' split over axes that split 'group' (here c and r)"));
  }
  {  // d_ff over cols beside groups over cols: processors sharing an expert's width would hold other tokens
    using L_g_rc_e_r_ff_c = mt::layout<grid, mt::split<group, r_, c_>, mt::split<experts, r_>, mt::split<d_ff, c_>>;
    const model<L_g_rc_e_r_ff_c> m(g);
    REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, ragged_of(deepseek_like)),
                        Catch::Matchers::ContainsSubstring("and 'd_ff' split over none of 'group''s axes (here over c)"));
  }
  // d_model over cols: refused where cols has more than one processor, served where it has one.
  const model<L_ge_r_model_c> m(g);
  if (g.sizes()[1] > 1) {
    REQUIRE_THROWS_WITH(nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, ragged_of(deepseek_like)),
                        Catch::Matchers::ContainsSubstring("'d_model' not split (here over c)"));
  } else {
    const auto r = nn::routed_moe<dims>(m.x, m.wr, m.bias, m.wg, m.wu, m.wd, ragged_of(deepseek_like));
    REQUIRE(max_rel_error(mt::gather_all(r.y), reference(host_weights(m), deepseek_like, false).y) < 1e-12);
  }
}

// Expert parallelism inside pipeline stages: two blocks x + routed_moe(x) (the ragged dispatch,
// DeepSeek's sigmoid router), one per stage on two stages of [p/2 x 1] (experts over the stage's
// rows) or [1 x p/2] (each expert's d_ff over its cols), 3 microbatches under 1F1B and ZB-H1 (whose
// split backward leaves the experts' weights to the ragged rule's B pass): the last stage's loss and
// every block's gradients equal the two blocks computed whole on one processor, and a planned stage
// counts the alltoalls and sends the run counted.
namespace {
namespace pl = meshtensor::pipeline;
constexpr int pipelined_blocks = 2, pipelined_microbatches = 3;

template <class L>
struct moe_blocks {
  using mo = model<L>;
  using X = typename mo::X;
  using WR = typename mo::WR;
  using WI = typename mo::WI;
  using WO = typename mo::WO;
  typename mo::B bias;
  std::vector<WR> wr;
  std::vector<WI> wg, wu;
  std::vector<WO> wd;
  // Blocks [first, first + count) of the model, each block's weights of its own seeds.
  moe_blocks(const grid& g, int first, int count) : bias(mt::random_normal<typename mo::B>(g, mo::eb, 3, 0, 0.3)) {
    for (int b = first; b < first + count; ++b) {
      const auto seed = [b](int k) { return static_cast<std::uint64_t>(20 + 10 * b + k); };
      wr.push_back(mt::random_normal<WR>(g, mo::er, seed(1)).requires_grad());
      wg.push_back(mt::random_normal<WI>(g, mo::ei, seed(2)).requires_grad());
      wu.push_back(mt::random_normal<WI>(g, mo::ei, seed(3)).requires_grad());
      wd.push_back(mt::random_normal<WO>(g, mo::eo, seed(4)).requires_grad());
    }
  }
  static X input(const grid& g, int mb) { return mt::random_normal<X>(g, mo::ex, 100 + static_cast<std::uint64_t>(mb)); }
  X through(X x) const {
    for (std::size_t b = 0; b < wr.size(); ++b)
      x = x + nn::routed_moe<dims>(x, wr[b], bias, wg[b], wu[b], wd[b], ragged_of(deepseek_like)).y;
    return x;
  }
  auto params() { return std::tie(wr, wg, wu, wd); }
};

template <class L>
struct moe_stage : moe_blocks<L> {
  using typename moe_blocks<L>::X;
  using activation = X;
  using gradients = std::tuple<std::vector<typename moe_blocks<L>::WR>, std::vector<typename moe_blocks<L>::WI>,
                               std::vector<typename moe_blocks<L>::WI>, std::vector<typename moe_blocks<L>::WO>>;
  const pl::stages<grid>& st;
  std::optional<gradients> grads;
  mutable double loss_sum = 0;
  explicit moe_stage(const pl::stages<grid>& s)
      : moe_blocks<L>(s.mesh(), s.index() * (pipelined_blocks / s.count()), pipelined_blocks / s.count()), st(s) {}
  typename X::extents_type extents(int) const { return moe_blocks<L>::mo::ex; }
  X forward(int mb, const X* in) const { return this->through(in ? *in : this->input(st.mesh(), mb)); }
  auto loss(int mb, const X& y) const {
    auto l = weighted_sum(y, 1000 + static_cast<std::uint64_t>(mb));
    if (!st.planned()) loss_sum += mt::item(l);
    return l;
  }
  void step_gradients(gradients&& g) { grads = std::move(g); }
};
}  // namespace

TEST_CASE("routed_moe's ragged dispatch in pipeline stages equals the blocks on one processor",
          "[nn][moe][routed][ragged][pipeline]") {
  const int p = world_size(), stage_count = p >= 2 ? 2 : 1, per_stage = p / stage_count;
  const grid self(MPI_COMM_SELF, {1, 1});
  moe_blocks<L_rep> whole(self, 0, pipelined_blocks);
  std::optional<ten<L_rep>> total;
  for (int mb = 0; mb < pipelined_microbatches; ++mb) {
    auto l = weighted_sum(whole.through(whole.input(self, mb)), 1000 + static_cast<std::uint64_t>(mb));
    total = total ? ten<L_rep>(*total + l) : l;
  }
  const auto want = std::apply([&](auto&... w) { return mt::gradient(*total, w...); }, whole.params());
  const auto check = [&]<class L>(std::array<int, 2> sizes) {
    for (const char* kind : {"1f1b", "zb-h1"}) {
      INFO(layout_name<L>() << " on " << stage_count << " stages of [" << sizes[0] << " x " << sizes[1] << "], " << kind);
      pl::stages<grid> st(MPI_COMM_WORLD, stage_count, sizes);
      moe_stage<L> stage(st);
      const auto schedule = pl::named_schedule(kind, stage_count, pipelined_microbatches);
      st.mesh().reset_counters();
      (void)pl::run(schedule, st, stage);
      const auto counted = st.mesh().counters();
      if (st.last()) require_close(std::vector<double>{stage.loss_sum}, std::vector<double>{mt::item(*total)}, 1e-12);
      const int first = st.index() * (pipelined_blocks / stage_count);
      const auto compare = [&](const auto& got, const auto& all) {
        for (std::size_t b = 0; b < got.size(); ++b)
          require_close(mt::gather_all(got[b]), mt::gather_all(all[static_cast<std::size_t>(first) + b]), 1e-10);
      };
      compare(std::get<0>(*stage.grads), std::get<0>(want));
      compare(std::get<1>(*stage.grads), std::get<1>(want));
      compare(std::get<2>(*stage.grads), std::get<2>(want));
      compare(std::get<3>(*stage.grads), std::get<3>(want));
      // Per block and microbatch three alltoalls forward, two backward, over the experts' axes.
      constexpr unsigned expert_axes = L::template split_of<experts>().mask();
      if (expert_axes != 0 && sizes[0] > 1)
        REQUIRE(counted.at({mt::collective::alltoall, expert_axes}).calls ==
                5 * pipelined_microbatches * (pipelined_blocks / stage_count));
      auto planned = pl::stages<grid>::planned(stage_count, st.index(), sizes, {st.mesh().coord<r_>(), st.mesh().coord<c_>()});
      moe_stage<L> planned_stage(planned);
      (void)pl::run(schedule, planned, planned_stage);
      const auto counted_planned = planned.mesh().counters();
      REQUIRE(counted_planned.size() == counted.size());
      for (const auto& [key, count] : counted) REQUIRE(counted_planned.at(key).calls == count.calls);
    }
  };
  check.operator()<L_ge_r>({per_stage, 1});
  check.operator()<L_ge_r_ff_c>({1, per_stage});
}
