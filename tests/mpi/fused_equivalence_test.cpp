// Fused elementwise expressions (ops/fused.hpp): the same maths written once, run by mt::fuse and
// by the recording ops, gives the same values and gradients under every layout of meshes [P] and
// [2x2], even and uneven; the gradients equal finite differences; bf16 stays within 1e-2 of float;
// the tape keeps only the tensors the backward reads; a plan counts one kernel per expression.
#include <test_support.hpp>

#include <catch2/matchers/catch_matchers_string.hpp>

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
std::array<std::int64_t, 3> ext{4, 6, 8};

// Written once, applied to tensors (the recording ops) and to fuse's placeholders.
struct mixed_chain {
  auto operator()(const auto& x, const auto& b, const auto& c) const {
    return mt::gelu(x + b) * c - 0.5 * mt::where(mt::greater(x, 0.0), x, mt::square(b)) +
           mt::exp(-mt::square(c)) / (2.0 + x * x) + mt::maximum(x, c) * mt::sigmoid(b);
  }
};
struct dropout_residual {
  auto operator()(const auto& x, const auto& s) const { return x + nn::dropout(s * 2.0, 0.25, 11, 3); }
};

// y and d(weighted sum of y)/d(each input), gathered.
template <class Y, class... Xs>
std::vector<std::vector<double>> value_and_grads(const Y& y, const Xs&... xs) {
  std::vector<std::vector<double>> out{mt::gather_all(y)};
  const auto grads = mt::gradient(weighted_sum(y, 77), xs...);
  std::apply([&](const auto&... g) { (out.push_back(mt::gather_all(g)), ...); }, grads);
  return out;
}

template <class M, class Layouts>
void run_layouts(const M& g, Layouts layouts) {
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    using X = ten<L, i_, j_, k_>;
    using B = ten<L, k_>;
    using C = ten<L, j_, k_>;
    auto x = mt::random_normal<X>(g, {ext[0], ext[1], ext[2]}, 1);
    auto b = mt::random_normal<B>(g, {ext[2]}, 2);
    auto c = mt::random_normal<C>(g, {ext[1], ext[2]}, 3);
    auto s = mt::random_normal<X>(g, {ext[0], ext[1], ext[2]}, 4);
    x.requires_grad(), b.requires_grad(), c.requires_grad(), s.requires_grad();
    {
      const auto want = value_and_grads(mixed_chain{}(x, b, c), x, b, c);
      const auto got = value_and_grads(mt::fuse(mixed_chain{}, x, b, c), x, b, c);
      for (std::size_t n = 0; n != want.size(); ++n) {
        INFO("mixed chain, " << (n == 0 ? "value" : "gradient of input " + std::to_string(n - 1)));
        require_close(got[n], want[n], 1e-12);
      }
    }
    {
      const auto want = value_and_grads(dropout_residual{}(x, s), x, s);
      const auto got = value_and_grads(mt::fuse(dropout_residual{}, x, s), x, s);
      for (std::size_t n = 0; n != want.size(); ++n) {
        INFO("dropout + residual, " << (n == 0 ? "value" : "gradient of input " + std::to_string(n - 1)));
        require_close(got[n], want[n], 1e-12);
      }
    }
  });
}
}  // namespace

TEST_CASE("fused expressions equal the recording ops under every layout", "[equivalence]") {
  ext = GENERATE(std::array<std::int64_t, 3>{4, 6, 8}, std::array<std::int64_t, 3>{7, 5, 2});
  INFO("extents " << ext[0] << " x " << ext[1] << " x " << ext[2]);
  SECTION("mesh [P]") { run_layouts(world_line(), line_layouts<line, i_, j_, k_>{}); }
  SECTION("mesh [2x2]") { run_layouts(world_grid(), grid_layouts<i_, j_, k_>{}); }
}

TEST_CASE("fused gradients equal central finite differences", "[gradient]") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using X = ten<L, i_, j_>;
  using B = ten<L, j_>;
  const auto other = mt::random_uniform<B>(g, {6}, 5, 0.5, 1.5);
  const auto fixed = mt::random_uniform<X>(g, {4, 6}, 6, 0.5, 1.5);
  auto f = [](auto x, auto b) {
    return mt::pow(x, b) + mt::log(x) * mt::tanh(b) - mt::minimum(x, b) / mt::sqrt(x + b) + mt::rsqrt(x) +
           mt::reciprocal(b) * mt::sin(x) - mt::cos(b) + mt::relu(x - 1.0) + mt::abs(x - b);
  };
  SECTION("through the tensor of the result's dims") {
    check_gradient<X>(g, {4, 6}, mt::gather_all(mt::random_uniform<X>(g, {4, 6}, 7, 0.5, 1.5)),
                      [&](const X& x) { return weighted_sum(mt::fuse(f, x, other), 8); }, {.h = 1e-6, .tol = 1e-6});
  }
  SECTION("through the broadcast one (summed over i, split over r)") {
    check_gradient<B>(g, {6}, mt::gather_all(mt::random_uniform<B>(g, {6}, 9, 0.5, 1.5)),
                      [&](const B& b) { return weighted_sum(mt::fuse(f, fixed, b), 8); }, {.h = 1e-6, .tol = 1e-6});
  }
}

TEST_CASE("fused bf16 is within 1e-2 of float", "[equivalence]") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<k_, c_>>;
  using XF = mt::tensor<float, L, i_, j_, k_>;
  using BF = mt::tensor<float, L, k_>;
  using XH = mt::tensor<mt::bf16, L, i_, j_, k_>;
  using BH = mt::tensor<mt::bf16, L, k_>;
  auto f = [](auto x, auto b) { return mt::gelu(x + b) + nn::dropout(x, 0.1, 3, 1) * mt::sigmoid(b); };
  auto x = mt::random_normal<XF>(g, {5, 6, 7}, 1);
  auto b = mt::random_normal<BF>(g, {7}, 2);
  x.requires_grad(), b.requires_grad();
  const auto xh = mt::cast<mt::bf16>(x);
  const auto bh = mt::cast<mt::bf16>(b);
  const auto want = f(x, b);
  const auto got = mt::fuse(f, xh, bh);
  require_close(mt::gather_all(mt::cast<float>(got)), mt::gather_all(want), 1e-2);
  const auto [gx, gb] = mt::gradient(sum_all(mt::cast<float>(got)), x, b);
  const auto [wx, wb] = mt::gradient(sum_all(want), x, b);
  require_close(mt::gather_all(gx), mt::gather_all(wx), 1e-2);
  // b's gradient sums 30 elements each: relative to its size.
  require_close(mt::gather_all(gb), mt::gather_all(wb), 3e-1);
}

TEST_CASE("the tape keeps only the tensors the backward reads", "[fuse]") {
  const auto g = world_line();
  using X = ten<mt::layout<line, mt::split<i_, x_>>, i_, j_>;
  auto x = mt::random_normal<X>(g, {4, 6}, 1);
  auto y = mt::random_normal<X>(g, {4, 6}, 2);
  x.requires_grad(), y.requires_grad();
  const auto held = [](const X& t) { return t.view().use_count(); };
  const auto x0 = held(x), y0 = held(y);
  // Linear: the backward reads no value (dropout's mask is drawn again from its counter).
  const auto linear = mt::fuse([](auto a, auto b) { return a * 2.0 - nn::dropout(b, 0.5, 1, 1) + 1.0; }, x, y);
  CHECK(held(x) == x0);
  CHECK(held(y) == y0);
  // x * y reads both; gelu(x) + y reads x only.
  const auto product = mt::fuse([](auto a, auto b) { return a * b; }, x, y);
  CHECK(held(x) == x0 + 1);
  CHECK(held(y) == y0 + 1);
  const auto activation = mt::fuse([](auto a, auto b) { return mt::gelu(a) + b; }, x, y);
  CHECK(held(x) == x0 + 2);
  CHECK(held(y) == y0 + 1);
  // And the gradients through the data-less entries are still right.
  const auto [gx, gy] = mt::gradient(sum_all(linear) + sum_all(product) + sum_all(activation), x, y);
  const auto xs = mt::gather_all(x), ys = mt::gather_all(y), gxs = mt::gather_all(gx), gys = mt::gather_all(gy);
  for (std::size_t n = 0; n != xs.size(); ++n) {
    const double u = 0.7978845608028654 * (xs[n] + 0.044715 * xs[n] * xs[n] * xs[n]);
    const double dgelu = 0.5 * (1 + std::tanh(u)) + 0.5 * xs[n] * (1 - std::tanh(u) * std::tanh(u)) *
                                                         0.7978845608028654 * (1 + 3 * 0.044715 * xs[n] * xs[n]);
    REQUIRE(std::abs(gxs[n] - (2.0 + ys[n] + dgelu)) <= 1e-12 * std::max(1.0, std::abs(gxs[n])));
  }
  // y's: -mask (0 or -2) + x + 1.
  for (std::size_t n = 0; n != ys.size(); ++n) {
    const double mask = -(gys[n] - xs[n] - 1.0);
    REQUIRE((std::abs(mask) < 1e-12 || std::abs(mask - 2.0) < 1e-12));
  }
}

TEST_CASE("a plan counts one kernel and one result per fused expression", "[fuse]") {
  const auto g = world_grid();
  const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
  using L = mt::layout<grid, mt::split<i_, r_>>;
  using X = ten<L, i_, j_>;
  using B = ten<L, j_>;
  const X x(pm, {8, 6});
  const B b(pm, {6});
  auto& ledger = mt::detail::plan_ledger::get();
  const auto k0 = ledger.kernels();
  const auto fused = mt::fuse([](auto a, auto c) { return mt::gelu(a + c) * 0.5 - a; }, x, b);
  CHECK(ledger.kernels() - k0 == 1);
  const auto k1 = ledger.kernels();
  const auto unfused = mt::gelu(x + b) * 0.5 - x;
  CHECK(ledger.kernels() - k1 >= 4);
  CHECK(fused.extents() == unfused.extents());
}

TEST_CASE("fuse names the dim whose extents differ", "[fuse]") {
  const auto g = world_line();
  using X = ten<mt::layout<line>, i_, j_>;
  using B = ten<mt::layout<line>, j_>;
  const auto x = mt::zeros<X>(g, {4, 6});
  const auto b = mt::zeros<B>(g, {5});
  REQUIRE_THROWS_WITH(mt::fuse([](auto a, auto c) { return a + c; }, x, b),
                      Catch::Matchers::ContainsSubstring("fuse: dim 'j' has extent 6") &&
                          Catch::Matchers::ContainsSubstring("but 5"));
  REQUIRE_THROWS_WITH(mt::fuse([](auto a) { return nn::dropout(a, 1.0, 1, 1); }, x),
                      Catch::Matchers::ContainsSubstring("dropout: rate 1 must be below 1"));
}
