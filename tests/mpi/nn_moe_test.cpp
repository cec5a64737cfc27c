// nn::moe: outputs and the load-balancing loss equal a plain loop over tokens written here (top-2
// routing, capacity in routing order, relu experts), under every layout below; the collectives
// counted equal moe_plan, and with experts split where the groups were, the dispatch and return
// are one alltoall each; gradients of x and of all three weights equal central differences; Adam
// training of the layer lowers its loss, with the same losses under every layout.
#include <meshtensor/nn/dense.hpp>
#include <meshtensor/nn/moe.hpp>
#include <meshtensor/optim/adam.hpp>
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

constexpr std::int64_t G = 4, S = 6, M = 4, F = 8, E = 4, capacity = 2;

// Replicated; groups and experts over one axis; over rows with d_ff or d_model over cols; over both.
using L_rep = mt::layout<grid>;
using L_ge_r = mt::layout<grid, mt::split<group, r_>, mt::split<experts, r_>>;
using L_ge_r_ff_c = mt::layout<grid, mt::split<group, r_>, mt::split<experts, r_>, mt::split<d_ff, c_>>;
using L_ge_r_model_c = mt::layout<grid, mt::split<group, r_>, mt::split<experts, r_>, mt::split<d_model, c_>>;
using L_ge_rc = mt::layout<grid, mt::split<group, r_, c_>, mt::split<experts, r_, c_>>;
using all_layouts = list<L_rep, L_ge_r, L_ge_r_ff_c, L_ge_r_model_c, L_ge_rc>;

template <class L>
struct model {
  using X = mt::tensor<double, L, group, token, d_model>;
  using WG = mt::tensor<double, L, d_model, EU>;
  using WI = mt::tensor<double, L, experts, d_model, d_ff>;
  using WO = mt::tensor<double, L, experts, d_ff, d_model>;
  static constexpr typename X::extents_type ex{G, S, M};
  static constexpr typename WG::extents_type eg{M, E};
  static constexpr typename WI::extents_type ei{E, M, F};
  static constexpr typename WO::extents_type eo{E, F, M};
  // Random inputs, the same global values under every layout; wscale scales the weights.
  X x;
  WG wg;
  WI wi;
  WO wo;
  model(const grid& g, double wscale)
      : x(mt::random_normal<X>(g, ex, 1)),
        wg(mt::random_normal<WG>(g, eg, 2, 0, 2 * wscale)),
        wi(mt::random_normal<WI>(g, ei, 3, 0, wscale)),
        wo(mt::random_normal<WO>(g, eo, 4, 0, wscale)) {}
};

struct reference_result {
  std::vector<double> y;
  double aux = 0;
  int dropped = 0, kept_second = 0;
};

// The layer as a loop over tokens, from the global (row-major) tensors.
reference_result reference_moe(const std::vector<double>& x, const std::vector<double>& wg,
                               const std::vector<double>& wi, const std::vector<double>& wo) {
  reference_result r;
  r.y.assign(G * S * M, 0.0);
  double aux = 0;
  for (std::int64_t g = 0; g < G; ++g) {
    std::vector<std::array<double, E>> gate(S);
    std::vector<std::array<std::int64_t, 2>> pick(S);
    for (std::int64_t s = 0; s < S; ++s) {
      double mx = -INFINITY;
      for (std::int64_t e = 0; e < E; ++e) {
        double l = 0;
        for (std::int64_t m = 0; m < M; ++m) l += x[(g * S + s) * M + m] * wg[m * E + e];
        gate[s][e] = l;
        mx = std::max(mx, l);
      }
      double z = 0;
      for (auto& v : gate[s]) z += (v = std::exp(v - mx));
      for (auto& v : gate[s]) v /= z;
      std::int64_t a = 0;
      for (std::int64_t e = 1; e < E; ++e)
        if (gate[s][e] > gate[s][a]) a = e;
      std::int64_t b = a == 0 ? 1 : 0;
      for (std::int64_t e = 0; e < E; ++e)
        if (e != a && gate[s][e] > gate[s][b]) b = e;
      pick[s] = {a, b};
    }
    // Capacity: first choices in token order, then second choices.
    std::array<std::int64_t, E> load{};
    std::vector<std::array<bool, 2>> kept(S);
    for (int k = 0; k < 2; ++k)
      for (std::int64_t s = 0; s < S; ++s) {
        kept[s][k] = load[pick[s][k]]++ < capacity;
        r.dropped += !kept[s][k];
        r.kept_second += k == 1 && kept[s][k];
      }
    for (std::int64_t s = 0; s < S; ++s) {
      const double norm = gate[s][pick[s][0]] + gate[s][pick[s][1]] + 1e-9;
      for (int k = 0; k < 2; ++k) {
        if (!kept[s][k]) continue;
        const std::int64_t e = pick[s][k];
        for (std::int64_t f = 0; f < F; ++f) {
          double h = 0;
          for (std::int64_t m = 0; m < M; ++m) h += x[(g * S + s) * M + m] * wi[(e * M + m) * F + f];
          h = std::max(h, 0.0);
          for (std::int64_t m = 0; m < M; ++m)
            r.y[(g * S + s) * M + m] += gate[s][e] / norm * h * wo[(e * F + f) * M + m];
        }
      }
    }
    for (std::int64_t e = 0; e < E; ++e) {
      double first = 0, mean_gate = 0;
      for (std::int64_t s = 0; s < S; ++s) {
        first += pick[s][0] == e;
        mean_gate += gate[s][e];
      }
      aux += (first / S) * (mean_gate / S);
    }
  }
  r.aux = aux / (G * E) * E * E;
  return r;
}
}  // namespace

TEST_CASE("moe equals a loop over tokens under every layout", "[nn][moe]") {
  const auto g = world_grid();
  for_each_type(all_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using m = model<L>;
    const auto [x, wg, wi, wo] = m(g, 1.0);
    const auto want = reference_moe(mt::gather_all(x), mt::gather_all(wg), mt::gather_all(wi), mt::gather_all(wo));
    // The inputs exercise capacity: some choices are dropped, some second choices are kept.
    REQUIRE(want.dropped > 0);
    REQUIRE(want.kept_second > 0);
    const auto [y, aux] = nn::moe<dims>(x, wg, wi, wo, capacity);
    REQUIRE(max_rel_error(mt::gather_all(y), want.y) < 1e-12);
    REQUIRE(std::abs(mt::gather_all(aux)[0] - want.aux) < 1e-12 * std::max(1.0, want.aux));
  });
}

TEST_CASE("moe communicates as moe_plan; experts split where groups were: one alltoall each way",
          "[nn][moe][comm_plan]") {
  const auto g = world_grid();
  for_each_type(all_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using m = model<L>;
    const auto [x, wg, wi, wo] = m(g, 1.0);
    g.reset_counters();
    (void)nn::moe<dims>(x, wg, wi, wo, capacity);
    require_counts(g.counters(), nn::moe_plan<dims, typename m::X>().as_counts());
    constexpr unsigned group_axes = L::template split_of<group>().mask();
    if constexpr (group_axes != 0) {
      const auto it = g.counters().find({mt::collective::alltoall, group_axes});
      REQUIRE(it != g.counters().end());
      REQUIRE(it->second.calls == 2);
    }
  });
}

TEST_CASE("moe gradients equal central differences", "[nn][moe][gradient]") {
  const auto g = world_grid();
  for_each_type(list<L_rep, L_ge_r_ff_c, L_ge_rc>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using m = model<L>;
    using X = typename m::X;
    using WG = typename m::WG;
    using WI = typename m::WI;
    using WO = typename m::WO;
    const auto [x, wg, wi, wo] = m(g, 1.0);
    auto loss = [&](const X& x_, const WG& wg_, const WI& wi_, const WO& wo_) {
      const auto r = nn::moe<dims>(x_, wg_, wi_, wo_, capacity);
      return weighted_sum(r.y, 5) + r.aux_loss;
    };
    const gradient_check_options every_third{.stride = 3};
    check_gradient<X>(g, m::ex, mt::gather_all(x), [&](const X& v) { return loss(v, wg, wi, wo); }, every_third);
    check_gradient<WG>(g, m::eg, mt::gather_all(wg), [&](const WG& v) { return loss(x, v, wi, wo); });
    check_gradient<WI>(g, m::ei, mt::gather_all(wi), [&](const WI& v) { return loss(x, wg, v, wo); }, every_third);
    check_gradient<WO>(g, m::eo, mt::gather_all(wo), [&](const WO& v) { return loss(x, wg, wi, v); }, every_third);
  });
}

TEST_CASE("moe trains with Adam: the loss falls, the same under every layout", "[nn][moe][training]") {
  const auto g = world_grid();
  std::vector<double> reference;
  for_each_type(list<L_rep, L_ge_r_ff_c, L_ge_rc>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using m = model<L>;
    using X = typename m::X;
    auto [x, wg, wi, wo] = m(g, 0.5);
    auto target = mt::tanh(mt::random_normal<X>(g, m::ex, 9));
    wg.requires_grad();
    wi.requires_grad();
    wo.requires_grad();
    mt::optim::adam opt({.lr = 0.02});
    std::vector<double> losses;
    for (int step = 0; step < 30; ++step) {
      const auto r = nn::moe<dims>(x, wg, wi, wo, capacity);
      const auto loss = sum_all(mt::square(r.y - target)) * (1.0 / (G * S * M)) + 0.01 * r.aux_loss;
      losses.push_back(mt::gather_all(loss)[0]);
      opt.step(std::tie(wg, wi, wo), mt::gradient(loss, wg, wi, wo));
    }
    INFO("first loss " << losses.front() << ", last " << losses.back());
    REQUIRE(losses.back() < 0.7 * losses.front());
    if (reference.empty()) reference = losses;
    REQUIRE(max_rel_error(losses, reference) < 1e-9);
  });
}
