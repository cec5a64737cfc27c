// Gradients of elementwise ops, reduce_sum, broadcast_to and einsum equal central finite
// differences (float64), under replicated and split layouts.
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
// Checks d loss / d x against central differences on the full (gathered) tensor. loss_of builds a
// scalar loss from x; x is rebuilt from host values for every perturbation.
template <class X, class M, class F>
void check_gradient(const M& g, const typename X::extents_type& ext, std::uint64_t seed, F loss_of,
                    double lo = -1.0, double hi = 1.0) {
  auto x0 = mt::random_uniform<X>(g, ext, seed, lo, hi);
  const auto host = mt::gather_all(x0);
  auto x = mt::from_host<X>(g, ext, host);
  x.requires_grad();
  auto [gx] = mt::gradient(loss_of(x), x);
  const auto analytic = mt::gather_all(gx);
  const double h = 1e-6;
  // A sample of positions keeps the test fast; the stride is coprime with the extents used.
  for (std::size_t n = 0; n < host.size(); n += 7) {
    auto plus = host, minus = host;
    plus[n] += h;
    minus[n] -= h;
    const double fp = mt::gather_all(loss_of(mt::from_host<X>(g, ext, plus)))[0];
    const double fm = mt::gather_all(loss_of(mt::from_host<X>(g, ext, minus)))[0];
    const double numeric = (fp - fm) / (2 * h);
    INFO("element " << n);
    REQUIRE(std::abs(analytic[n] - numeric) <= 1e-6 * std::max(1.0, std::abs(numeric)));
  }
}

template <class M, class Layouts>
void run_all(const M& g, Layouts layouts) {
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    using IJ = mt::tensor<double, L, i_, j_>;
    using JK = mt::tensor<double, L, j_, k_>;
    using K = mt::tensor<double, L, k_>;
    const typename IJ::extents_type e_ij{4, 8};
    auto w = mt::random_normal<JK>(g, {8, 12}, 99);
    auto v = mt::random_normal<K>(g, {12}, 98);
    auto weighted = [&](const auto& y) {
      return mt::reduce_sum<i_, k_>(mt::einsum<i_, k_>(y, w) * v);
    };
    {  // unary ops
      check_gradient<IJ>(g, e_ij, 1, [&](const IJ& x) {
        return weighted(mt::exp(x) + mt::tanh(x) * mt::sigmoid(x) + mt::gelu(x) + mt::square(x) + mt::sin(x) +
                        mt::cos(x) + mt::negative(x) + mt::relu(x) + mt::abs(x));
      });
      check_gradient<IJ>(g, e_ij, 2, [&](const IJ& x) {
        return weighted(mt::log(x) + mt::sqrt(x) + mt::rsqrt(x) + mt::reciprocal(x));
      }, 0.5, 2.0);
    }
    {  // binary ops with broadcasting
      auto other = mt::random_uniform<mt::tensor<double, L, j_>>(g, {8}, 3, 0.5, 1.5);
      check_gradient<IJ>(g, e_ij, 4, [&](const IJ& x) {
        return weighted(x * other + x / other - other / (x + 3.0) + mt::maximum(x, other * 0.1) +
                        mt::minimum(x, other * 0.2) + mt::pow(x + 2.0, other) + mt::where(mt::greater(x, 0.0), x, x * x));
      });
      // The broadcast operand's gradient sums over the dims it lacks.
      using J = mt::tensor<double, L, j_>;
      auto base = mt::random_normal<IJ>(g, e_ij, 5);
      check_gradient<J>(g, {8}, 6, [&](const J& y) { return weighted(base * y + y); });
    }
    {  // reductions, broadcast_to and einsum
      check_gradient<IJ>(g, e_ij, 7, [&](const IJ& x) {
        auto s = mt::reduce_sum<i_>(x);                              // [j]
        auto back = mt::broadcast_to<IJ>(s * s, x.extents());        // [i, j]
        return weighted(back + x) + mt::einsum<>(x, x) + mt::reduce_sum<j_>(mt::einsum<j_>(x, x));
      });
      check_gradient<JK>(g, {8, 12}, 8, [&](const JK& y) {
        auto a = mt::random_normal<IJ>(g, e_ij, 9);
        return mt::reduce_sum<i_, k_>(mt::einsum<i_, k_>(a, y) * mt::einsum<i_, k_>(a, y)) +
               mt::einsum<>(mt::einsum<k_>(a, y), v);
      });
    }
  });
}
}  // namespace

TEST_CASE("gradients equal central finite differences", "[gradient]") {
  using split_ij = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using split_jk = mt::layout<grid, mt::split<j_, r_, c_>>;
  using split_k = mt::layout<grid, mt::split<k_, c_, r_>>;
  run_all(world_grid(), list<mt::layout<grid>, split_ij, split_jk, split_k>{});
}
