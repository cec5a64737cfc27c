// einsum equals a hand-written loop (and reduce_sum one by hand), float32 einsum through BLAS agrees
// with float64, and the collectives that elementwise ops, reduce_sum and einsum run equal their
// static plans for every layout of meshes [P] and [2x2] (bytes checked by hand for einsum). einsum in
// every shape under every layout is swept in the program's other TU (einsum_test.layouts.cpp), which
// compiles in parallel.
#include <test_support.hpp>

#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;

namespace {
constexpr double tol = 1e-12;
const std::array<std::int64_t, 3> ext{4, 8, 12};


template <class M, class Layouts>
void run_all(const M& g, Layouts layouts) {
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    using IJ = mt::tensor<double, L, i_, j_>;
    using JK = mt::tensor<double, L, j_, k_>;
    using IJK = mt::tensor<double, L, i_, j_, k_>;
    auto a = mt::random_normal<IJ>(g, {ext[0], ext[1]}, 1);
    auto b = mt::random_normal<JK>(g, {ext[1], ext[2]}, 2);
    auto x = mt::random_normal<IJK>(g, ext, 3);

    g.reset_counters();
    auto y = mt::exp(a) * b + a;
    require_counts(g, mt::comm_plan{});  // elementwise: nothing

    g.reset_counters();
    auto s = mt::reduce_sum<j_>(x);
    require_counts(g, mt::reduce_plan<decltype(s), IJK>());

    g.reset_counters();
    auto c = mt::einsum<i_, k_>(a, b);
    constexpr auto plan = mt::einsum_plan<list<i_, k_>, IJ, JK>();
    require_counts(g, plan);
    // j is contracted: when split, one allreduce over its axes moving the local block of c.
    constexpr unsigned j_axes = L::template split_of<j_>().mask();
    STATIC_REQUIRE((plan.size == 1) == (j_axes != 0));
    if constexpr (j_axes != 0) {
      const auto& count = g.counters().at({mt::collective::allreduce, j_axes});
      REQUIRE(count.bytes == c.local_size() * std::int64_t(sizeof(double)));
    }

    g.reset_counters();
    auto k_only = mt::einsum<k_>(a, b);  // i summed in a first, then j contracted
    require_counts(g, mt::einsum_plan<list<k_>, IJ, JK>());
    (void)y;
    (void)k_only;
  });
}
}  // namespace

TEST_CASE("einsum equals a hand-written loop", "[equivalence]") {
  auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using IJ = mt::tensor<double, L, i_, j_>;
  using JK = mt::tensor<double, L, j_, k_>;
  using IJK = mt::tensor<double, L, i_, j_, k_>;
  const std::int64_t I = 4, J = 8, K = 6;
  auto a = mt::random_normal<IJ>(g, {I, J}, 11);
  auto b = mt::random_normal<JK>(g, {J, K}, 12);
  auto x = mt::random_normal<IJK>(g, {I, J, K}, 13);
  const auto ha = mt::gather_all(a), hb = mt::gather_all(b), hx = mt::gather_all(x);
  std::vector<double> want(I * K, 0.0);
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < J; ++j)
      for (int k = 0; k < K; ++k) want[i * K + k] += ha[i * J + j] * hb[j * K + k];
  REQUIRE(max_rel_error(mt::gather_all(mt::einsum<i_, k_>(a, b)), want) <= tol);
  // Batched: out[i, k] = sum_j x[i, j, k] * b[j, k] (k is a batch dim of both operands).
  std::vector<double> want2(I * K, 0.0);
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < J; ++j)
      for (int k = 0; k < K; ++k) want2[i * K + k] += hx[(i * J + j) * K + k] * hb[j * K + k];
  REQUIRE(max_rel_error(mt::gather_all(mt::einsum<i_, k_>(x, b)), want2) <= tol);
  // reduce_sum by hand.
  std::vector<double> want3(I * K, 0.0);
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < J; ++j)
      for (int k = 0; k < K; ++k) want3[i * K + k] += hx[(i * J + j) * K + k];
  REQUIRE(max_rel_error(mt::gather_all(mt::reduce_sum<j_>(x)), want3) <= tol);
}

TEST_CASE("float32 einsum through BLAS agrees with float64 to float tolerance", "[equivalence]") {
  auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  auto a = mt::random_normal<mt::tensor<float, L, i_, j_>>(g, {64, 96}, 1);
  auto b = mt::random_normal<mt::tensor<float, L, j_, k_>>(g, {96, 32}, 2);
  auto a64 = mt::random_normal<mt::tensor<double, L, i_, j_>>(g, {64, 96}, 1);
  auto b64 = mt::random_normal<mt::tensor<double, L, j_, k_>>(g, {96, 32}, 2);
  const auto got = mt::gather_all(mt::einsum<i_, k_>(a, b));
  const auto want = mt::gather_all(mt::einsum<i_, k_>(a64, b64));
  double worst = 0;
  for (std::size_t n = 0; n < got.size(); ++n) worst = std::max(worst, std::abs(got[n] - want[n]) / std::max(1.0, std::abs(want[n])));
  REQUIRE(worst <= 1e-5);  // float32: ~1e-7 per op, 96-term sums
}

TEST_CASE("elementwise, reduce_sum and einsum communicate exactly their plan", "[comm_plan]") {
  SECTION("mesh [P]") { run_all(world_line(), line_layouts<line, i_, j_, k_>{}); }
  SECTION("mesh [2x2]") { run_all(world_grid(), grid_layouts<i_, j_, k_>{}); }
}
