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

// Many positions onto few outputs: under the team walk (a GPU's; mpi.reductions_test.team_rows on
// the CPU) each output's positions are reduced in chunks of 4096 by a team each, then the chunks'
// results combined (kernels/reduce.hpp). J = 20000 split over the line's axis: at 1 and 2 ranks
// every output here has two or more chunks, the last one partial; a NaN in one chunk of row 1.
TEST_CASE("reductions of many positions onto few outputs equal a host loop, chunk by chunk", "[equivalence]") {
  const line g = world_line();
  constexpr std::int64_t I = 3, J = 20000;
  using L = mt::layout<line, mt::split<j_, x_>>;
  using X = mt::tensor<float, L, i_, j_>;
  std::vector<float> h(I * J);
  for (std::int64_t n = 0; n < I * J; ++n) h[n] = static_cast<float>(std::sin(0.37 * static_cast<double>(n)) + 0.25);
  const auto x = mt::from_host<X>(g, {I, J}, std::span<const float>(h));
  std::vector<float> with_nan = h;
  with_nan[1 * J + 15000] = NAN;
  const auto xn = mt::from_host<X>(g, {I, J}, std::span<const float>(with_nan));
  std::vector<double> row_sum(I, 0.0), row_abs(I, 0.0);
  std::vector<float> row_min(I, INFINITY);
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < J; ++j) {
      row_sum[i] += h[i * J + j];
      row_abs[i] += std::abs(h[i * J + j]);
      row_min[i] = std::min(row_min[i], h[i * J + j]);
    }
  // A float sum of n addends is within n ulps of the exact one, relative to the sum of magnitudes.
  const auto rows = mt::gather_all(mt::reduce_sum<j_>(x));
  for (std::int64_t i = 0; i < I; ++i) REQUIRE(std::abs(rows[i] - row_sum[i]) <= 1e-7 * J * row_abs[i]);
  const double total = row_sum[0] + row_sum[1] + row_sum[2], total_abs = row_abs[0] + row_abs[1] + row_abs[2];
  REQUIRE(std::abs(mt::gather_all(mt::reduce_sum<i_, j_>(x))[0] - total) <= 1e-7 * I * J * total_abs);
  REQUIRE(mt::gather_all(mt::reduce_min<j_>(x)) == row_min);
  REQUIRE(mt::gather_all(mt::reduce_min<i_, j_>(x))[0] == *std::min_element(row_min.begin(), row_min.end()));
  const auto maxes = mt::gather_all(mt::reduce_max<j_>(xn));
  REQUIRE((!std::isnan(maxes[0]) && std::isnan(maxes[1]) && !std::isnan(maxes[2])));
  REQUIRE(std::isnan(mt::gather_all(mt::reduce_max<i_, j_>(xn))[0]));
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
