// Layout transparency of elementwise ops, reduce_sum, transpose and einsum: under every layout of
// meshes [P] and [2x2], the gathered result equals the replicated (single-processor) result, and
// einsum equals a hand-written loop. float64 throughout: tolerance 1e-12 relative. This TU sweeps
// the unary ops; binary ops, reduce_sum and transpose, and einsum are swept in the program's other
// TUs (elementwise_einsum_equivalence_test.<part>.cpp), which compile in parallel.
#include "elementwise_einsum_equivalence.hpp"

using namespace tst;
using namespace tst::elementwise_einsum;
namespace mt = meshtensor;

namespace {
template <class Exec, class M, class Layouts>
void run_unary(const M& g, Layouts layouts) {
  check_all_layouts<Exec>(g, layouts, []<class L, class E>(const M& g) {
    using T = mt::basic_tensor<double, L, E, i_, j_, k_>;
    auto x = mt::random_normal<T>(g, ext, 1);
    auto p = mt::random_uniform<T>(g, ext, 2, 0.5, 2.0);
    auto y = mt::exp(mt::tanh(x)) + mt::sigmoid(x) * mt::gelu(x) - mt::relu(x) + mt::abs(x) + mt::square(x) +
             mt::log(p) + mt::sqrt(p) + mt::rsqrt(p) + mt::negative(x) + mt::reciprocal(p) + mt::sin(x) +
             mt::cos(x);
    return mt::gather_all(y);
  });
}
}  // namespace

MESHTENSOR_OPS_CORE_SWEEP("unary ops", run_unary)

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
