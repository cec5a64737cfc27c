// NaN propagates, the same under every layout (docs/concepts.md, "NaN"): reduce_max / reduce_min,
// logsumexp, softmax / log_softmax, softmax cross-entropy and elementwise maximum / minimum give NaN
// wherever an element they combine is NaN, and top_k ranks NaN above every number (ties among NaNs
// to the lower index). A 12 x 12 input holds NaNs at the first, a middle and the last position of
// the reduced dim, at positions that fall in different processors' slices (12 is cut into 2, 3,
// 4 and 6 parts), two NaNs in a row, a row of NaNs, NaN beside +inf and beside -inf, and rows
// without NaN. Every op runs under every layout of line_layouts / grid_layouts (replicated, the
// reduced dim split over one axis or over both, the other dim split), reducing along the tensor's
// last dim and, transposed, along its first (the two paths of reduce_to's kernel), and is checked
// against a host loop that applies the rule.
// Before the rule (issue 10): reduce_max / reduce_min (both kernel paths), maximum / minimum and
// top_k failed under every layout at every rank count; softmax, log_softmax, logsumexp and the
// cross-entropy were already NaN (the NaN reaches the sum of exponentials). With the local kernels
// fixed but MPI_MAX / MPI_MIN across processors, reduce_max / reduce_min still failed under every
// layout that splits j.
#include <catch2/catch_template_test_macros.hpp>
#include <cmath>
#include <limits>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
constexpr std::int64_t R = 12;  // rows: the kept dim i
// The reduced dim j: 12 (divisible into 1, 2, 3, 4 and 6 parts), then 11 (uneven over each).
std::int64_t N = 12;
constexpr std::int64_t K = 5;   // top_k's k: more than a slice holds at 4 and 6 parts
constexpr double nan_ = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

// x[i][j], row-major. Finite values are distinct within a row (no ties but the -inf ones).
std::vector<double> input() {
  std::vector<double> x(R * N);
  for (std::int64_t i = 0; i < R; ++i)
    for (std::int64_t j = 0; j < N; ++j) x[i * N + j] = 4 * std::sin(1.3 * double(i) + 0.7 * double(j) + 0.1);
  auto at = [&](std::int64_t i, std::int64_t j) -> double& { return x[i * N + j]; };
  // Row 0: no NaN.
  at(1, 0) = nan_;   // first element (processor 0's slice)
  at(2, N - 1) = nan_;  // last element (the last processor's slice)
  at(3, 5) = nan_;   // middle: the end of processor 0's half at 2 parts, processor 1's at 4
  at(4, 6) = nan_;   // middle: the start of processor 1's half at 2 parts
  at(5, 3) = nan_;   // the first element of processor 1 at 4 parts, the last of processor 0 at 3
  at(6, 8) = nan_;   // the first of processor 2 at 3 parts, the first of processor 4 at 6
  at(7, 0) = nan_;   // two NaNs, in different slices
  at(7, 7) = nan_;
  for (std::int64_t j = 0; j < N; ++j) at(8, j) = nan_;  // all NaN
  at(9, 1) = inf;                                         // NaN beats +inf in max
  at(9, 4) = nan_;
  for (std::int64_t j = 0; j < N; ++j) at(10, j) = -inf;  // NaN beside -inf only
  at(10, 9) = nan_;
  for (std::int64_t j = 0; j < N; ++j) at(11, j) += 1000;  // no NaN; exp overflows unshifted
  return x;
}
std::vector<double> transposed(const std::vector<double>& x) {
  std::vector<double> t(x.size());
  for (std::int64_t i = 0; i < R; ++i)
    for (std::int64_t j = 0; j < N; ++j) t[j * R + i] = x[i * N + j];
  return t;
}
// A second operand for maximum / minimum: NaNs where x has none, and x's finite values shifted.
std::vector<double> other_input() {
  std::vector<double> y(R * N);
  for (std::int64_t n = 0; n < R * N; ++n) y[n] = 4 * std::cos(0.9 * double(n));
  y[0 * N + 4] = nan_;
  y[11 * N + 0] = nan_;
  y[11 * N + N - 1] = nan_;
  y[1 * N + 0] = nan_;  // NaN in both operands
  return y;
}
std::vector<std::int64_t> labels() {
  std::vector<std::int64_t> l(R);
  for (std::int64_t i = 0; i < R; ++i) l[i] = (5 * i + 2) % N;
  return l;
}

// ---- the rule, on the host ----------------------------------------------------------------
bool any_nan(const double* v) {
  for (std::int64_t j = 0; j < N; ++j)
    if (std::isnan(v[j])) return true;
  return false;
}
std::vector<double> h_reduce(const std::vector<double>& x, bool max) {
  std::vector<double> out(R);
  for (std::int64_t i = 0; i < R; ++i) {
    const double* v = &x[i * N];
    double m = v[0];
    for (std::int64_t j = 1; j < N; ++j) m = max ? std::max(m, v[j]) : std::min(m, v[j]);
    out[i] = any_nan(v) ? nan_ : m;
  }
  return out;
}
double h_lse_row(const double* v) {
  if (any_nan(v)) return nan_;
  double m = -inf;
  for (std::int64_t j = 0; j < N; ++j) m = std::max(m, v[j]);
  double s = 0;
  for (std::int64_t j = 0; j < N; ++j) s += std::exp(v[j] - m);
  return m + std::log(s);
}
std::vector<double> h_lse(const std::vector<double>& x) {
  std::vector<double> out(R);
  for (std::int64_t i = 0; i < R; ++i) out[i] = h_lse_row(&x[i * N]);
  return out;
}
std::vector<double> h_softmax(const std::vector<double>& x, bool log) {
  std::vector<double> out(x.size());
  for (std::int64_t i = 0; i < R; ++i) {
    const double lse = h_lse_row(&x[i * N]);
    for (std::int64_t j = 0; j < N; ++j) {
      const double v = x[i * N + j];
      out[i * N + j] = std::isnan(lse) ? nan_ : log ? v - lse : std::exp(v - lse);
    }
  }
  return out;
}
// top_k: NaN first (lower index first among NaNs), then values descending, ties to the lower index.
void h_top_k(const std::vector<double>& x, std::vector<double>& values, std::vector<double>& indices) {
  values.clear();
  indices.clear();
  for (std::int64_t i = 0; i < R; ++i) {
    std::vector<std::int64_t> idx(N);
    for (std::int64_t j = 0; j < N; ++j) idx[j] = j;
    const double* v = &x[i * N];
    std::stable_sort(idx.begin(), idx.end(), [v](std::int64_t a, std::int64_t b) {
      if (std::isnan(v[a]) || std::isnan(v[b])) return std::isnan(v[a]) && !std::isnan(v[b]);
      return v[a] > v[b];
    });
    for (std::int64_t q = 0; q < K; ++q) {
      values.push_back(v[idx[q]]);
      indices.push_back(double(idx[q]));
    }
  }
}
std::vector<double> h_xent(const std::vector<double>& x) {
  const auto l = labels();
  std::vector<double> out(R);
  for (std::int64_t i = 0; i < R; ++i) out[i] = h_lse_row(&x[i * N]) - x[i * N + l[i]];
  return out;
}
std::vector<double> h_elementwise(const std::vector<double>& a, const std::vector<double>& b, bool max) {
  std::vector<double> out(a.size());
  for (std::size_t n = 0; n < a.size(); ++n)
    out[n] = std::isnan(a[n]) || std::isnan(b[n]) ? nan_ : max ? std::max(a[n], b[n]) : std::min(a[n], b[n]);
  return out;
}

// NaN exactly where want has NaN, infinities equal, finite values within tol relative to
// max(1, |want|). Reports the first element that differs; CHECK, so that every op that breaks
// the rule is reported, not only the first.
template <class T>
void require_match(const char* what, const std::vector<T>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  std::int64_t bad = -1;
  for (std::size_t n = 0; n < got.size() && bad < 0; ++n) {
    const double g = double(got[n]), w = want[n];
    const bool ok = std::isnan(w)   ? std::isnan(g)
                    : std::isinf(w) ? g == w
                                    : std::abs(g - w) <= tol * std::max(1.0, std::abs(w));
    if (!ok) bad = std::int64_t(n);
  }
  INFO(what << ": element " << bad << " is " << (bad < 0 ? 0.0 : double(got[bad])) << ", expected "
            << (bad < 0 ? 0.0 : want[bad]));
  CHECK(bad == -1);
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Every op of the rule under layout L, element type T, space S.
template <class T, class S, class M, class L>
void check_nan_rule(const M& m) {
  INFO(layout_name<L>() << (sizeof(T) == 4 ? ", float" : ", double"));
  using X = mt::basic_tensor<T, L, S, i_, j_>;   // reduced along j, the last dim
  using Xt = mt::basic_tensor<T, L, S, j_, i_>;  // reduced along j, the first dim
  using Lab = mt::basic_tensor<std::int64_t, L, S, i_>;
  // float: x - lse near 1000 (row 11) is exact to float's ulp there, 6e-5.
  const double tol = sizeof(T) == 4 ? 5e-4 : 1e-12;
  // The host values rounded to T, so that the references see what the tensors hold.
  auto rounded = [](std::vector<double> v) {
    for (auto& e : v) e = double(T(e));
    return v;
  };
  const auto hx = rounded(input()), hy = rounded(other_input());
  const auto ht = transposed(hx);
  const std::vector<T> tx(hx.begin(), hx.end()), ty(hy.begin(), hy.end()), tt(ht.begin(), ht.end());
  const auto x = mt::from_host<X>(m, {R, N}, tx);
  const auto y = mt::from_host<X>(m, {R, N}, ty);
  const auto xt = mt::from_host<Xt>(m, {N, R}, tt);
  const auto lab = mt::from_host<Lab>(m, {R}, labels());

  const auto want_max = h_reduce(hx, true), want_min = h_reduce(hx, false);
  require_match("reduce_max over the last dim", mt::gather_all(mt::reduce_max<j_>(x)), want_max, 0);
  require_match("reduce_min over the last dim", mt::gather_all(mt::reduce_min<j_>(x)), want_min, 0);
  require_match("reduce_max over the first dim", mt::gather_all(mt::reduce_max<j_>(xt)), want_max, 0);
  require_match("reduce_min over the first dim", mt::gather_all(mt::reduce_min<j_>(xt)), want_min, 0);
  require_match("logsumexp", mt::gather_all(mt::logsumexp<j_>(x)), h_lse(hx), tol);
  require_match("softmax", mt::gather_all(mt::softmax<j_>(x)), h_softmax(hx, false), tol);
  require_match("log_softmax", mt::gather_all(mt::log_softmax<j_>(x)), h_softmax(hx, true), tol);
  require_match("softmax over the first dim", mt::gather_all(mt::softmax<j_>(xt)), transposed(h_softmax(hx, false)),
                tol);
  std::vector<double> tv, ti;
  h_top_k(hx, tv, ti);
  const auto tk = mt::top_k<j_, l_>(x, K);
  require_match("top_k values", mt::gather_all(tk.values), tv, 0);
  require_match("top_k indices", to_double(mt::gather_all(tk.indices)), ti, 0);
  require_match("softmax_cross_entropy", mt::gather_all(nn::softmax_cross_entropy<j_>(x, lab)), h_xent(hx), tol);
  require_match("maximum(x, y)", mt::gather_all(mt::maximum(x, y)), h_elementwise(hx, hy, true), 0);
  require_match("maximum(y, x)", mt::gather_all(mt::maximum(y, x)), h_elementwise(hx, hy, true), 0);
  require_match("minimum(x, y)", mt::gather_all(mt::minimum(x, y)), h_elementwise(hx, hy, false), 0);
  require_match("minimum(y, x)", mt::gather_all(mt::minimum(y, x)), h_elementwise(hx, hy, false), 0);
}
}  // namespace

TEST_CASE("NaN propagates through max, min, softmax, cross-entropy and top_k alike under every layout",
          "[nan][equivalence]") {
  N = GENERATE(12, 11);
  INFO("extent of j " << N);
  SECTION("mesh [P]") {
    auto m = world_line();
    for_each_type(line_layouts<line, i_, j_>{},
                  [&]<class L>() { check_nan_rule<double, Kokkos::DefaultExecutionSpace, line, L>(m); });
  }
  SECTION("mesh [2x2] (or [P x 1], [2x3])") {
    auto m = world_grid();
    for_each_type(grid_layouts<i_, j_>{},
                  [&]<class L>() { check_nan_rule<double, Kokkos::DefaultExecutionSpace, grid, L>(m); });
  }
}

// float (its own MPI reduction op) on every execution space, j split over both axes or one.
TEMPLATE_TEST_CASE("NaN propagates in float on every execution space", "[nan][equivalence]", MESHTENSOR_TEST_SPACES) {
  N = 11;  // uneven over 2, 3, 4 and 6 parts
  auto m = world_grid();
  using L1 = mt::layout<grid, mt::split<j_, r_, c_>>;
  using L2 = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  check_nan_rule<float, TestType, grid, L1>(m);
  check_nan_rule<float, TestType, grid, L2>(m);
}

// The gradients of the rule: reduce_max's goes to the NaN elements of a NaN row (the elements
// "equal" to the result), to the max elsewhere; maximum's to the NaN operand (the first if both).
TEST_CASE("reduce_max's and maximum's gradients go to the NaN elements", "[nan][equivalence]") {
  N = 12;
  auto m = world_grid();
  using L0 = mt::layout<grid>;
  using L1 = mt::layout<grid, mt::split<j_, r_, c_>>;
  using L2 = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  const auto hx = input(), hy = other_input();
  for_each_type(list<L0, L1, L2>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = ten<L, i_, j_>;
    auto x = mt::from_host<X>(m, {R, N}, hx);
    auto y = mt::from_host<X>(m, {R, N}, hy);
    x.requires_grad();
    y.requires_grad();
    const auto [gx] = mt::gradient(sum_all(mt::reduce_max<j_>(x)), x);
    const auto want_max = h_reduce(hx, true);
    std::vector<double> want(R * N);
    for (std::int64_t i = 0; i < R; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        const double v = hx[i * N + j], w = want_max[i];
        want[i * N + j] = (v == w || (std::isnan(v) && std::isnan(w))) ? 1 : 0;
      }
    require_match("reduce_max gradient", mt::gather_all(gx), want, 0);
    const auto [ga, gb] = mt::gradient(sum_all(mt::maximum(x, y)), x, y);
    std::vector<double> wa(R * N), wb(R * N);
    for (std::int64_t n = 0; n < R * N; ++n) {
      const bool first = std::isnan(hx[n]) || (!std::isnan(hy[n]) && hx[n] >= hy[n]);
      wa[n] = first ? 1 : 0;
      wb[n] = first ? 0 : 1;
    }
    require_match("maximum gradient to x", mt::gather_all(ga), wa, 0);
    require_match("maximum gradient to y", mt::gather_all(gb), wb, 0);
  });
}
