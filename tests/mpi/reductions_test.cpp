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

namespace {
// x[i, j, k] transposed to [j, k, i] and [k, i, j], and a matrix [j, k] to [k, j], against a host
// loop over the gathered input, exactly. [j, k, i] and [k, j] read the input strided along their
// last dim and unit-strided along the one before: the map kernel's transposing tiles (8 runs for
// complex doubles, 32 for floats), whose last tile is partial here (5 x 19 = 95 runs over j split
// unevenly, 19 runs of a matrix).
template <class T>
void check_transposes_exactly(const line& g) {
  constexpr std::int64_t I = 3, J = 5, K = 19;
  using L = mt::layout<line, mt::split<j_, x_>>;
  using X = mt::tensor<T, L, i_, j_, k_>;
  using M = mt::tensor<T, L, j_, k_>;
  std::vector<T> h(I * J * K), hm(J * K);
  for (std::size_t n = 0; n < h.size(); ++n) h[n] = T(static_cast<float>(n) + 0.5f);
  for (std::size_t n = 0; n < hm.size(); ++n) hm[n] = T(static_cast<float>(n) - 7.25f);
  const auto x = mt::from_host<X>(g, {I, J, K}, std::span<const T>(h));
  const auto m = mt::from_host<M>(g, {J, K}, std::span<const T>(hm));
  std::vector<T> jki, kij, kj;
  for (std::int64_t j = 0; j < J; ++j)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t i = 0; i < I; ++i) jki.push_back(h[(i * J + j) * K + k]);
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t j = 0; j < J; ++j) kij.push_back(h[(i * J + j) * K + k]);
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t j = 0; j < J; ++j) kj.push_back(hm[j * K + k]);
  REQUIRE(mt::gather_all(mt::transpose<j_, k_, i_>(x)) == jki);
  REQUIRE(mt::gather_all(mt::transpose<k_, i_, j_>(x)) == kij);
  REQUIRE(mt::gather_all(mt::transpose<k_, j_>(m)) == kj);
}
}  // namespace

TEST_CASE("transposes equal a host loop, tile by tile", "[equivalence]") {
  const auto g = world_line();
  check_transposes_exactly<float>(g);
  check_transposes_exactly<double>(g);
  check_transposes_exactly<mt::complex<double>>(g);
}
