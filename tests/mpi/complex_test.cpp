// Complex tensors (element/complex.hpp, ops/complex_parts.hpp) under every layout of a line and a
// 2x2 grid: moved bit for bit (relayout, gather), elementwise ops, sums and products (zgemm and
// cgemm) against std::complex arithmetic on the host; and gradients in the conjugate Wirtinger
// convention against central differences of the real and imaginary parts; fuse over complex
// tensors against the ops unfused.
#include <complex>
#include <random>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
using zd = mt::complex<double>;
using zf = mt::complex<float>;

namespace {
constexpr std::int64_t I = 5, J = 7, K = 3;

template <class T>
std::vector<T> random_values(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> v(n);
  for (auto& z : v) z = T(u(rng), u(rng));
  return v;
}
std::complex<double> s(zd z) { return mt::to_std(z); }

double distance(zd a, std::complex<double> b) { return std::abs(s(a) - b); }

template <class M, class L>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<zd, L, i_, j_>;
  using Y = mt::tensor<zd, L, j_, k_>;
  const auto xh = random_values<zd>(I * J, 1), yh = random_values<zd>(J * K, 2);
  const auto x = mt::from_host<X>(g, {I, J}, std::span<const zd>(xh));
  const auto y = mt::from_host<Y>(g, {J, K}, std::span<const zd>(yh));

  {
    INFO("moved bit for bit");
    using Replicated = mt::tensor<zd, mt::layout<M>, i_, j_>;
    const auto back = mt::gather_all(mt::relayout<Replicated>(x));
    for (std::int64_t n = 0; n < I * J; ++n) REQUIRE((back[n].real() == xh[n].real() && back[n].imag() == xh[n].imag()));
  }
  {
    INFO("elementwise: x * x + exp(x) / x, conj, real, imag and abs");
    const auto e = mt::gather_all(x * x + mt::exp(x) / x);
    const auto c = mt::gather_all(mt::conj(x));
    const auto re = mt::gather_all(mt::real(x)), im = mt::gather_all(mt::imag(x)), magnitude = mt::gather_all(mt::abs(x));
    for (std::int64_t n = 0; n < I * J; ++n) {
      const auto v = s(xh[n]);
      REQUIRE(distance(e[n], v * v + std::exp(v) / v) < 1e-13);
      REQUIRE(distance(c[n], std::conj(v)) == 0);
      REQUIRE((re[n] == v.real() && im[n] == v.imag()));
      REQUIRE(std::abs(magnitude[n] - std::abs(v)) < 1e-15);
    }
  }
  {
    INFO("sums over split dims, and products (zgemm, cgemm)");
    const auto rows = mt::gather_all(mt::reduce_sum<j_>(x));
    const auto p = mt::gather_all(mt::einsum<i_, k_>(x, y));
    const auto pf = mt::gather_all(mt::einsum<i_, k_>(mt::cast<zf>(x), mt::cast<zf>(y)));
    for (std::int64_t i = 0; i < I; ++i) {
      std::complex<double> r = 0;
      for (std::int64_t j = 0; j < J; ++j) r += s(xh[i * J + j]);
      REQUIRE(distance(rows[i], r) < 1e-14);
      for (std::int64_t k = 0; k < K; ++k) {
        std::complex<double> acc = 0;
        for (std::int64_t j = 0; j < J; ++j) acc += s(xh[i * J + j]) * s(yh[j * K + k]);
        INFO("product at " << i << ", " << k);
        REQUIRE(distance(p[i * K + k], acc) < 1e-13);
        REQUIRE(std::abs(std::complex<double>(pf[i * K + k].real(), pf[i * K + k].imag()) - acc) < 1e-5);
      }
    }
  }
}

// A real loss of complex tensors through every differentiable op here: products, exp, division,
// conj, real, imag, abs, make_complex and a cast from real to complex.
template <class X, class Y>
auto loss_of(const X& x, const Y& y) {
  const auto p = mt::einsum<i_, k_>(mt::exp(x) * mt::conj(x) + mt::cast<zd>(mt::real(x) * mt::imag(x)), y);
  const auto q = p / (mt::make_complex(mt::imag(p), mt::real(p)) + zd(3, 0));
  return mt::reduce_sum<i_, k_>(mt::real(q * q) + mt::imag(q) + mt::abs(q));
}

template <class M, class L>
void check_gradient(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<zd, L, i_, j_>;
  using Y = mt::tensor<zd, L, j_, k_>;
  const auto xh = random_values<zd>(I * J, 3), yh = random_values<zd>(J * K, 4);
  auto x = mt::from_host<X>(g, {I, J}, std::span<const zd>(xh));
  auto y = mt::from_host<Y>(g, {J, K}, std::span<const zd>(yh));
  x.requires_grad();
  y.requires_grad();
  const auto [dx, dy] = mt::gradient(loss_of(x, y), x, y);
  const auto dxh = mt::gather_all(dx), dyh = mt::gather_all(dy);
  // dL/dre + i dL/dim at a few elements of each, by central differences (to 1e-6 relative: the
  // differences' rounding and truncation errors are near 1e-6 of gradients of about 1 to 10).
  const double h = 1e-6;
  const auto numeric = [&](std::vector<zd> xs, std::vector<zd> ys, bool of_x, std::int64_t n) {
    auto& v = of_x ? xs : ys;
    std::complex<double> d;
    for (int part = 0; part < 2; ++part) {
      double f[2];
      for (int side = 0; side < 2; ++side) {
        auto w = v[n];
        const double step = side == 0 ? h : -h;
        w = part == 0 ? zd(w.real() + step, w.imag()) : zd(w.real(), w.imag() + step);
        std::swap(v[n], w);
        f[side] = mt::item(loss_of(mt::from_host<X>(g, {I, J}, std::span<const zd>(xs)),
                                   mt::from_host<Y>(g, {J, K}, std::span<const zd>(ys))));
        std::swap(v[n], w);
      }
      (part == 0 ? d.real((f[0] - f[1]) / (2 * h)) : d.imag((f[0] - f[1]) / (2 * h)));
    }
    return d;
  };
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{I * J / 2}, I * J - 1}) {
    INFO("dx at " << n);
    const auto want = numeric(xh, yh, true, n);
    INFO("numeric " << want);
    REQUIRE(distance(dxh[n], want) < 1e-6 * std::max(1.0, std::abs(want)));
  }
  for (const std::int64_t n : {std::int64_t{1}, J * K - 1}) {
    INFO("dy at " << n);
    const auto want = numeric(xh, yh, false, n);
    INFO("numeric " << want);
    REQUIRE(distance(dyh[n], want) < 1e-6 * std::max(1.0, std::abs(want)));
  }
}
// fuse over complex tensors, one of them broadcast over i (its gradient summed over i, split or
// not): the same values and gradients as the ops unfused, whose gradients check_gradient holds
// against central differences.
template <class M, class L>
void check_fused(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<zd, L, i_, j_>;
  using B = mt::tensor<zd, L, j_>;
  const auto xh = random_values<zd>(I * J, 5), bh = random_values<zd>(J, 6), wh = random_values<zd>(I * J, 7);
  auto x = mt::from_host<X>(g, {I, J}, std::span<const zd>(xh));
  auto b = mt::from_host<B>(g, {J}, std::span<const zd>(bh));
  const auto w = mt::from_host<X>(g, {I, J}, std::span<const zd>(wh));
  x.requires_grad();
  b.requires_grad();
  const auto fused = mt::fuse([](auto v, auto c) { return mt::exp(v) * c + v * v / (c + 3.0) - mt::sin(c) * 0.5; }, x, b);
  const auto ops = mt::exp(x) * b + x * x / (b + 3.0) - mt::sin(b) * 0.5;
  const auto real_loss = [&](const X& f) { return mt::reduce_sum<i_, j_>(mt::real(f * w) + mt::imag(f)); };
  const auto [dx_fused, db_fused] = mt::gradient(real_loss(fused), x, b);
  const auto [dx_ops, db_ops] = mt::gradient(real_loss(ops), x, b);
  const auto vf = mt::gather_all(fused), vo = mt::gather_all(ops);
  for (std::int64_t n = 0; n < I * J; ++n) REQUIRE(distance(vf[n], s(vo[n])) < 1e-13);
  const auto gxf = mt::gather_all(dx_fused), gxo = mt::gather_all(dx_ops);
  for (std::int64_t n = 0; n < I * J; ++n) {
    INFO("dx at " << n << ": fused " << s(gxf[n]) << ", ops " << s(gxo[n]));
    REQUIRE(distance(gxf[n], s(gxo[n])) < 1e-12);
  }
  const auto gbf = mt::gather_all(db_fused), gbo = mt::gather_all(db_ops);
  for (std::int64_t n = 0; n < J; ++n) {
    INFO("db at " << n << ": fused " << s(gbf[n]) << ", ops " << s(gbo[n]));
    REQUIRE(distance(gbf[n], s(gbo[n])) < 1e-12);
  }
}
}  // namespace

TEST_CASE("fuse over complex tensors: the ops' values and gradients", "[equivalence]") {
  const auto g = world_line();
  for_each_type(line_layouts<line, i_, j_>{}, [&]<class L>() { check_fused<line, L>(g); });
}

TEST_CASE("complex tensors under every layout of a line", "[equivalence]") {
  const auto g = world_line();
  for_each_type(line_layouts<line, i_, j_>{}, [&]<class L>() { check_layout<line, L>(g); });
}

TEST_CASE("complex tensors under every layout of a grid", "[equivalence]") {
  const auto g = world_grid();
  for_each_type(grid_layouts<i_, j_>{}, [&]<class L>() { check_layout<grid, L>(g); });
}

TEST_CASE("complex gradients are dL/dre + i dL/dim, against central differences", "[gradient]") {
  const auto g = world_line();
  for_each_type(line_layouts<line, i_, j_, k_>{}, [&]<class L>() { check_gradient<line, L>(g); });
  const auto gg = world_grid();
  for_each_type(grid_layouts<i_, j_>{}, [&]<class L>() { check_gradient<grid, L>(gg); });
}
