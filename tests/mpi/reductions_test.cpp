// reduce_sum and transpose under every layout of meshes [P] and [2x2] (the sweep of
// op_family_sweep.hpp), and reductions over rows long enough for several tiles against a host loop.
// The program's other TUs, which compile in parallel: reductions_test.softmax.cpp (reduce_mean, max,
// min, logsumexp, the softmaxes and cast against host loops), .gradient.cpp and .comm_plan.cpp.
#include "op_family_sweep.hpp"

using namespace tst;
using namespace tst::op_family;

namespace {
template <class Exec, class M, class Layouts>
void run_reductions(const M& g, Layouts layouts) {
  check_all_layouts<Exec>(g, layouts, []<class L, class E>(const M& g) {
    using T = mt::basic_tensor<double, L, E, i_, j_, k_>;
    auto x = mt::random_normal<T>(g, ext, 5);
    auto a = mt::gather_all(mt::reduce_sum<j_>(x));
    auto b = mt::gather_all(mt::reduce_sum<i_, k_>(x));
    auto c = mt::gather_all(mt::reduce_sum<i_, j_, k_>(x));
    auto d = mt::gather_all(mt::transpose<k_, i_, j_>(x));
    a.insert(a.end(), b.begin(), b.end());
    a.insert(a.end(), c.begin(), c.end());
    a.insert(a.end(), d.begin(), d.end());
    return a;
  });
}
}  // namespace

MESHTENSOR_OP_FAMILY_SWEEP("reduce_sum and transpose", run_reductions)

// Long runs of the output's last dim: the reduction works in tiles of 1024 outputs, so 2500 gives
// two full tiles and a partial one, with outputs contiguous in x (reducing i) or strided (reducing j).
TEST_CASE("reductions over long rows equal a host loop, tile by tile", "[equivalence]") {
  auto g = world_grid();
  constexpr std::int64_t I = 4, J = 2500;
  using L = mt::layout<grid, mt::split<i_, r_>>;
  using X = ten<L, i_, j_>;
  using XT = ten<L, j_, i_>;
  const auto x = mt::random_normal<X>(g, {I, J}, 5);
  const auto xt = mt::random_normal<XT>(g, {J, I}, 6);
  const auto h = mt::gather_all(x), ht = mt::gather_all(xt);
  std::vector<double> sum_i(J, 0.0), max_i(J, -INFINITY), sum_t(J, 0.0), min_t(J, INFINITY);
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < J; ++j) {
      sum_i[j] += h[i * J + j];
      max_i[j] = std::max(max_i[j], h[i * J + j]);
      sum_t[j] += ht[j * I + i];
      min_t[j] = std::min(min_t[j], ht[j * I + i]);
    }
  REQUIRE(max_rel_error(mt::gather_all(mt::reduce_sum<i_>(x)), sum_i) <= tol);
  REQUIRE(mt::gather_all(mt::reduce_max<i_>(x)) == max_i);
  REQUIRE(max_rel_error(mt::gather_all(mt::reduce_sum<i_>(xt)), sum_t) <= tol);
  REQUIRE(mt::gather_all(mt::reduce_min<i_>(xt)) == min_t);
}
