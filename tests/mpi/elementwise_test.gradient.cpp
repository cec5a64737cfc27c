// Gradients of elementwise ops, and of reduce_sum, broadcast_to and einsum composed with them, equal
// central finite differences (float64), under replicated and split layouts; and the gradient check
// catches a wrong gradient (a TU of mpi_elementwise_test).
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
// x uniform in [lo, hi) (seed); every 7th element (coprime with the extents used), h = 1e-6,
// tolerance 1e-6.
template <class X, class M, class F>
void check_grad(const M& g, const typename X::extents_type& ext, std::uint64_t seed, F loss_of, double lo = -1.0,
                double hi = 1.0) {
  check_gradient<X>(g, ext, mt::gather_all(mt::random_uniform<X>(g, ext, seed, lo, hi)), loss_of,
                    {.h = 1e-6, .tol = 1e-6, .stride = 7});
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
      check_grad<IJ>(g, e_ij, 1, [&](const IJ& x) {
        return weighted(mt::exp(x) + mt::tanh(x) * mt::sigmoid(x) + mt::gelu(x) + mt::square(x) + mt::sin(x) +
                        mt::cos(x) + mt::negative(x) + mt::relu(x) + mt::abs(x) + mt::silu(x));
      });
      check_grad<IJ>(g, e_ij, 2, [&](const IJ& x) {
        return weighted(mt::log(x) + mt::sqrt(x) + mt::rsqrt(x) + mt::reciprocal(x));
      }, 0.5, 2.0);
    }
    {  // binary ops with broadcasting
      auto other = mt::random_uniform<mt::tensor<double, L, j_>>(g, {8}, 3, 0.5, 1.5);
      check_grad<IJ>(g, e_ij, 4, [&](const IJ& x) {
        return weighted(x * other + x / other - other / (x + 3.0) + mt::maximum(x, other * 0.1) +
                        mt::minimum(x, other * 0.2) + mt::pow(x + 2.0, other) + mt::where(mt::greater(x, 0.0), x, x * x));
      });
      // The broadcast operand's gradient sums over the dims it lacks.
      using J = mt::tensor<double, L, j_>;
      auto base = mt::random_normal<IJ>(g, e_ij, 5);
      check_grad<J>(g, {8}, 6, [&](const J& y) { return weighted(base * y + y); });
    }
    {  // reductions, broadcast_to and einsum
      check_grad<IJ>(g, e_ij, 7, [&](const IJ& x) {
        auto s = mt::reduce_sum<i_>(x);                              // [j]
        auto back = mt::broadcast_to<IJ>(s * s, x.extents());        // [i, j]
        return weighted(back + x) + mt::einsum<>(x, x) + mt::reduce_sum<j_>(mt::einsum<j_>(x, x));
      });
      check_grad<JK>(g, {8, 12}, 8, [&](const JK& y) {
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

TEST_CASE("the gradient check can fail", "[gradient]") {
  using X = ten<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>, i_, j_>;
  const auto g = world_grid();
  const typename X::extents_type e{4, 8};
  const auto x0 = mt::gather_all(mt::random_normal<X>(g, e, 1));
  // loss = sum(x * w1 + stop_gradient(x) * w2): mt::gradient gives w1, finite differences w1 + w2.
  const auto wrong = gradient_error<X>(g, e, x0, [](const X& x) {
    return weighted_sum(x, 2) + weighted_sum(mt::stop_gradient(x), 3);
  });
  const bool one_processor = g.size<r_>() * g.size<c_>() == 1;
  // Every element at one processor; at more, 7 of the 32 (stride 4, made odd: 0, 5, ..., 30) and 2
  // random directions.
  REQUIRE(wrong.checked == (one_processor ? x0.size() : 7));
  REQUIRE(wrong.directions == (one_processor ? 0 : 2));
  REQUIRE(wrong.worst > 1e-2);
  // Wrong at element 1 alone, which the spread processors' sample skips: their directions find it.
  std::vector<double> at_one(x0.size(), 0.0);
  at_one[1] = 1;
  const auto mask = mt::from_host<X>(g, e, at_one);
  const auto one_wrong = gradient_error<X>(g, e, x0, [&](const X& x) {
    return weighted_sum(x, 2) + sum_all(mt::stop_gradient(x) * mask);
  });
  INFO("worst at " << one_wrong.element << ": relative error " << one_wrong.worst);
  REQUIRE(one_wrong.worst > 1e-2);
  if (one_processor) {
    REQUIRE(one_wrong.element == 1);
  } else {
    REQUIRE(one_wrong.element >= x0.size());  // a direction, not an element
  }
  // A loss that does not vary with x: the comparison passes, the norm of the gradient does not.
  const auto flat = gradient_error<X>(g, e, x0, [](const X& x) { return weighted_sum(x * 0.0, 3); });
  REQUIRE(flat.worst <= 1e-6);
  REQUIRE(flat.norm2 <= 1e-8);
}
