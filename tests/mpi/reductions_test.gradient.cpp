// Gradients of the reductions (reduce_mean, max, min, logsumexp), softmax, relayout, rename,
// reshape, cast and stop_gradient at 1, 2 and 4 ranks, float64 (a TU of mpi_reductions_test):
// mt::gradient(loss, x) equals central finite differences of loss = reduce_sum over all dims of
// (op(x) * w), w fixed random weights, under a replicated and split layouts (one dim over two axes
// included).
// Kokkos::DefaultExecutionSpace only: the rules call the same kernels on every space, and the
// equivalence smoke test runs those on each space.
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
// Small (32 elements: 64 loss evaluations per op and layout), divisible by 4, dims distinct.
const std::array<std::int64_t, 2> ext{4, 8};

// loss = sum(op(x) * w) at x = random normals (seed 21), all 32 elements checked. h = 1e-5:
// truncation (~h^2) and rounding (~1e-16 / h) errors both near 1e-10, so 1e-6 relative (to
// max(1, |g|)) separates a right gradient from a wrong one by orders of magnitude.
template <class X, class Op>
void check_op(const typename X::mesh_type& m, Op op, double h = 1e-5, double tol = 1e-6) {
  tst::check_gradient<X>(m, ext, mt::gather_all(mt::random_normal<X>(m, ext, 21)),
                         [&](const X& x) { return weighted_sum(op(x), 77); }, {.h = h, .tol = tol});
}

// Every differentiable op of this program under layout L; Other is a second layout to relayout to.
template <class M, class L, class Other>
void check_all(const M& m) {
  using X = ten<L, i_, j_>;
  INFO(layout_name<L>());
  SECTION("reduce_mean") {
    check_op<X>(m, [](const X& x) { return mt::reduce_mean<j_>(x); });
    check_op<X>(m, [](const X& x) { return mt::reduce_mean<i_, j_>(x); });
  }
  SECTION("reduce_max, reduce_min") {
    // Random normals have no ties, and h is far below the gaps, so the argmax does not move.
    check_op<X>(m, [](const X& x) { return mt::reduce_max<j_>(x); });
    check_op<X>(m, [](const X& x) { return mt::reduce_min<i_>(x); });
  }
  SECTION("logsumexp") {
    check_op<X>(m, [](const X& x) { return mt::logsumexp<j_>(x); });
    check_op<X>(m, [](const X& x) { return mt::logsumexp<i_, j_>(x); });
  }
  SECTION("softmax, log_softmax") {
    check_op<X>(m, [](const X& x) { return mt::softmax<j_>(x); });
    check_op<X>(m, [](const X& x) { return mt::softmax<i_>(x); });
    check_op<X>(m, [](const X& x) { return mt::log_softmax<j_>(x); });
    check_op<X>(m, [](const X& x) { return mt::causal_softmax<i_, j_>(x, 0.7); });
    check_op<X>(m, [](const X& x) { return mt::causal_softmax<j_, i_>(x, 1.3); });
  }
  SECTION("relayout, rename, replace_dimensions") {
    check_op<X>(m, [](const X& x) { return mt::relayout<ten<Other, i_, j_>>(x); });
    check_op<X>(m, [](const X& x) { return mt::rename<j_, l_>(x); });
    check_op<X>(m, [](const X& x) { return mt::replace_dimensions<list<i_, j_>, list<j_, i_>>(x); });
  }
  SECTION("reshape") {
    check_op<X>(m, [](const X& x) { return mt::reshape<l_>(x, {32}); });
    check_op<X>(m, [](const X& x) { return mt::reshape<i_, l_, m_>(x, {4, 2, 4}); });
    check_op<X>(m, [](const X& x) { return mt::replace_dimensions<list<i_>, list<l_, m_>>(x, {2, 2}); });
  }
  SECTION("cast") {
    // Through float and back: the loss is linear, so the only error is x +- h rounded to float
    // (relative 6e-8 of |x| ~ 3, over 2h = 2e-2): below 1e-4.
    check_op<X>(m, [](const X& x) { return mt::cast<double>(mt::cast<float>(x)); }, 1e-2, 1e-4);
  }
  SECTION("stop_gradient") {
    // loss = sum(x * w1 + stop_gradient(x) * w2): the gradient is w1 alone, where finite
    // differences would give w1 + w2.
    const auto x0 = mt::random_normal<X>(m, ext, 21);
    const auto w1 = mt::random_normal<X>(m, ext, 1);
    const auto w2 = mt::random_normal<X>(m, ext, 2);
    X x = x0;
    x.requires_grad();
    const auto [g] = mt::gradient(sum_all(x * w1 + mt::stop_gradient(x) * w2), x);
    REQUIRE(mt::gather_all(g) == mt::gather_all(w1));
  }
}
}  // namespace

TEST_CASE("reduction, softmax and reshape gradients equal central finite differences", "[softmax][gradient]") {
  using mt::layout;
  using mt::split;
  SECTION("mesh [P], replicated") {
    check_all<line, layout<line>, layout<line, split<j_, x_>>>(world_line());
  }
  SECTION("mesh [P], j split") {
    check_all<line, layout<line, split<j_, x_>>, layout<line, split<i_, x_>>>(world_line());
  }
  SECTION("mesh [2x2] (or [P x 1]), i and j split") {
    check_all<grid, layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<j_, r_, c_>>>(world_grid());
  }
  SECTION("mesh [2x2] (or [P x 1]), j over both axes") {
    check_all<grid, layout<grid, split<j_, c_, r_>>, layout<grid, split<i_, c_>, split<j_, r_>>>(world_grid());
  }
}
