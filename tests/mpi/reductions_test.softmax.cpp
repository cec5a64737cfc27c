// Reductions (reduce_mean/max/min, logsumexp), softmax, log_softmax, causal_softmax, cast and
// stop_gradient at 1, 2, 3, 4 and 6 ranks: under every layout of line_layouts / grid_layouts, the
// gathered result equals the result under the replicated layout and an independent host loop over
// the gathered input (a TU of mpi_reductions_test: see reductions_test.cpp). The renames' and
// reshapes' sweep is reshape_test.layouts.cpp, relayout's relayout_equivalence_test.cpp.
// Compile time: the all-layouts sweeps run on Kokkos::DefaultExecutionSpace only; every space in
// MESHTENSOR_TEST_SPACES gets a smaller smoke test (one split layout per op), so that the
// instantiation count stays op x layout, not op x layout x space.
#include <cmath>
#include <limits>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
// Divisible by 4 (the most processors a dim is cut into) and different, so that a mix-up of the
// two dims changes the shape. Two dims keep the sweep's instantiations (op x layout) affordable;
// they still cover a reduced dim split or not, a kept dim split or not, and one dim over two axes.
// Each sweep also runs with uneven extents (13, 3): uneven over 2, 3, 4 and 6 parts, and 3 is
// smaller than 4 or 6 parts, so some processors hold nothing.
std::array<std::int64_t, 2> ext{8, 12};
void choose_extents(bool uneven) {
  ext = uneven ? std::array<std::int64_t, 2>{13, 3} : std::array<std::int64_t, 2>{8, 12};
}
constexpr std::uint64_t seed = 11;

// Float64 results summed in another order differ by a few ulps; 1e-12 relative is far above that
// and far below any indexing mistake.
constexpr double tol64 = 1e-12;

// ---- independent host reference (row-major i, j) ------------------------------------------
// Elements grouped by their indices along the kept dims (red[d]: dim d is reduced); groups are in
// row-major order of the kept dims, which is the order of the result's dims.
struct grouping {
  std::vector<std::vector<double>> groups;
  std::vector<std::size_t> key;  // group of each element
};
grouping group_by(const std::vector<double>& x, std::array<bool, 2> red) {
  grouping g;
  g.key.resize(x.size());
  g.groups.resize((red[0] ? 1 : ext[0]) * (red[1] ? 1 : ext[1]));
  for (std::int64_t i = 0; i < ext[0]; ++i)
    for (std::int64_t j = 0; j < ext[1]; ++j) {
      const std::size_t key = red[0] ? (red[1] ? 0 : j) : (red[1] ? i : i * ext[1] + j);
      const std::size_t flat = i * ext[1] + j;
      g.key[flat] = key;
      g.groups[key].push_back(x[flat]);
    }
  return g;
}
double h_mean(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e;
  return s / v.size();
}
double h_max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double h_min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double h_lse(const std::vector<double>& v) {
  const double m = h_max(v);
  double s = 0;
  for (double e : v) s += std::exp(e - m);
  return m + std::log(s);
}
template <class F>
std::vector<double> host_reduce(const std::vector<double>& x, std::array<bool, 2> red, F f) {
  const auto g = group_by(x, red);
  std::vector<double> out;
  for (const auto& v : g.groups) out.push_back(f(v));
  return out;
}
// softmax (log = false) or log_softmax (log = true) over the reduced dims.
std::vector<double> host_softmax(const std::vector<double>& x, std::array<bool, 2> red, bool log) {
  const auto g = group_by(x, red);
  std::vector<double> lse;
  for (const auto& v : g.groups) lse.push_back(h_lse(v));
  std::vector<double> out(x.size());
  for (std::size_t n = 0; n < x.size(); ++n) out[n] = log ? x[n] - lse[g.key[n]] : std::exp(x[n] - lse[g.key[n]]);
  return out;
}

// causal_softmax of scale * x along j (along_i false: query dim i) or along i (query dim j): an
// element takes part where its position along the softmax's dim is at most the query position,
// and is 0 where it does not.
std::vector<double> host_causal_softmax(const std::vector<double>& x, bool along_i, double scale) {
  std::vector<double> out(x.size(), 0.0);
  const std::int64_t rows = along_i ? ext[1] : ext[0], n = along_i ? ext[0] : ext[1];
  for (std::int64_t q = 0; q < rows; ++q) {
    const auto at = [&](std::int64_t l) { return along_i ? l * ext[1] + q : q * ext[1] + l; };
    const std::int64_t visible = std::min(q + 1, n);
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (std::int64_t l = 0; l < visible; ++l) mx = std::max(mx, scale * x[at(l)]);
    for (std::int64_t l = 0; l < visible; ++l) sum += std::exp(scale * x[at(l)] - mx);
    for (std::int64_t l = 0; l < visible; ++l) out[at(l)] = std::exp(scale * x[at(l)] - mx) / sum;
  }
  return out;
}

// ---- the sweeps ---------------------------------------------------------------------------
// op(x) under L against op(x) under the replicated layout, and against `want` (host loop).
template <class F, class X, class Xr>
void same_as_replicated(F op, const X& x, const Xr& xr, const std::vector<double>& want, double tol = tol64) {
  const auto got = mt::gather_all(op(x));
  require_close(got, mt::gather_all(op(xr)), tol);
  require_close(got, want, tol);
}

template <class M, class L>
void check_reductions_and_softmax(const M& m) {
  using X = ten<L, i_, j_>;
  using Xr = ten<mt::layout<M>, i_, j_>;
  INFO(layout_name<L>());
  const auto x = mt::random_normal<X>(m, ext, seed);
  const auto xr = mt::random_normal<Xr>(m, ext, seed);
  const auto h = mt::gather_all(xr);
  same_as_replicated([](const auto& t) { return mt::reduce_mean<j_>(t); }, x, xr, host_reduce(h, {0, 1}, h_mean));
  same_as_replicated([](const auto& t) { return mt::reduce_mean<i_, j_>(t); }, x, xr, host_reduce(h, {1, 1}, h_mean));
  // max and min pick an element: exact.
  same_as_replicated([](const auto& t) { return mt::reduce_max<i_>(t); }, x, xr, host_reduce(h, {1, 0}, h_max), 0);
  same_as_replicated([](const auto& t) { return mt::reduce_min<j_>(t); }, x, xr, host_reduce(h, {0, 1}, h_min), 0);
  same_as_replicated([](const auto& t) { return mt::logsumexp<j_>(t); }, x, xr, host_reduce(h, {0, 1}, h_lse));
  same_as_replicated([](const auto& t) { return mt::logsumexp<i_, j_>(t); }, x, xr, host_reduce(h, {1, 1}, h_lse));
  same_as_replicated([](const auto& t) { return mt::softmax<i_>(t); }, x, xr, host_softmax(h, {1, 0}, false));
  same_as_replicated([](const auto& t) { return mt::log_softmax<j_>(t); }, x, xr, host_softmax(h, {0, 1}, true));
  same_as_replicated([](const auto& t) { return mt::causal_softmax<i_, j_>(t, 0.5); }, x, xr,
                     host_causal_softmax(h, false, 0.5));
  same_as_replicated([](const auto& t) { return mt::causal_softmax<j_, i_>(t, 2.0); }, x, xr,
                     host_causal_softmax(h, true, 2.0));
  // cast: the float results are static_casts of the doubles, exactly; and back, their values.
  const std::vector<float> want(h.begin(), h.end());
  const auto f = mt::cast<float>(x);
  REQUIRE(mt::gather_all(f) == want);
  REQUIRE(mt::gather_all(mt::cast<double>(f)) == std::vector<double>(want.begin(), want.end()));
  REQUIRE(mt::gather_all(mt::stop_gradient(x)) == h);
}

}  // namespace

TEST_CASE("reductions, softmax and cast equal the replicated result and a host loop, every layout",
          "[softmax][equivalence]") {
  choose_extents(GENERATE(false, true));
  INFO("extents " << ext[0] << " x " << ext[1]);
  SECTION("mesh [P]") {
    auto m = world_line();
    for_each_type(line_layouts<line, i_, j_>{}, [&]<class L>() { check_reductions_and_softmax<line, L>(m); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto m = world_grid();
    for_each_type(grid_layouts<i_, j_>{}, [&]<class L>() { check_reductions_and_softmax<grid, L>(m); });
  }
}

TEMPLATE_TEST_CASE("reductions, softmax and reshapes: smoke on every execution space", "[softmax][equivalence]", MESHTENSOR_TEST_SPACES) {
  choose_extents(GENERATE(false, true));
  auto m = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using L2 = mt::layout<grid, mt::split<j_, r_>>;
  using X = mt::basic_tensor<double, L, TestType, i_, j_>;
  const auto x = mt::random_normal<X>(m, ext, seed);
  const auto h = mt::gather_all(x);
  require_close(mt::gather_all(mt::reduce_mean<i_, j_>(x)), host_reduce(h, {1, 1}, h_mean), tol64);
  require_close(mt::gather_all(mt::reduce_max<j_>(x)), host_reduce(h, {0, 1}, h_max), 0);
  require_close(mt::gather_all(mt::reduce_min<i_>(x)), host_reduce(h, {1, 0}, h_min), 0);
  require_close(mt::gather_all(mt::logsumexp<j_>(x)), host_reduce(h, {0, 1}, h_lse), tol64);
  require_close(mt::gather_all(mt::softmax<j_>(x)), host_softmax(h, {0, 1}, false), tol64);
  require_close(mt::gather_all(mt::log_softmax<i_>(x)), host_softmax(h, {1, 0}, true), tol64);
  REQUIRE(mt::gather_all(mt::relayout<mt::basic_tensor<double, L2, TestType, i_, j_>>(x)) == h);
  REQUIRE(mt::gather_all(mt::rename<j_, l_>(x)) == h);
  REQUIRE(mt::gather_all(mt::reshape<l_>(x, {ext[0] * ext[1]})) == h);
  REQUIRE(mt::gather_all(mt::cast<float>(x)) == std::vector<float>(h.begin(), h.end()));
}

TEST_CASE("logsumexp and softmax are stable for large and infinite inputs", "[softmax][equivalence]") {
  auto m = world_line();
  using T = ten<mt::layout<line, mt::split<j_, x_>>, i_, j_>;
  const double inf = std::numeric_limits<double>::infinity();
  // Row 0: huge values (naive exp overflows); row 1: all -inf (logsumexp is -inf, not NaN).
  std::vector<double> h{1000, 1001, 1002, 1003, -inf, -inf, -inf, -inf};
  const auto x = mt::from_host<T>(m, {2, 4}, h);
  const auto lse = mt::gather_all(mt::logsumexp<j_>(x));
  const double want0 = 1003 + std::log(std::exp(-3.0) + std::exp(-2.0) + std::exp(-1.0) + 1.0);
  REQUIRE(std::abs(lse[0] - want0) < 1e-12 * want0);
  REQUIRE(lse[1] == -inf);
  const auto sm = mt::gather_all(mt::softmax<j_>(x));
  double s = 0;
  for (int n = 0; n < 4; ++n) s += sm[n];
  REQUIRE(std::abs(s - 1.0) < 1e-12);
}

// Float rows in host memory take their own path (kernels/rows.hpp: the max and sum in lanes, the
// exponentials vectorised): every row length around the lanes' width, with its tail, split over the
// ranks or not, against a double host loop; log_softmax and a causal window; NaN and -inf rows.
TEST_CASE("float softmax rows of every length equal a double host loop", "[softmax][equivalence]") {
  auto m = world_line();
  using F = mt::basic_tensor<float, mt::layout<line>, Kokkos::DefaultExecutionSpace, i_, j_>;
  using Fs = mt::basic_tensor<float, mt::layout<line, mt::split<j_, x_>>, Kokkos::DefaultExecutionSpace, i_, j_>;
  const double tol = 4e-7;  // float's rounding of a few operations, relative to the row's largest
  for (const std::int64_t n : {1, 7, 8, 9, 17, 40}) {
    std::vector<double> h(3 * n);
    for (std::size_t k = 0; k < h.size(); ++k) h[k] = std::sin(0.7 * k) * 6 - 1;
    std::vector<double> want(h.size()), want_log(h.size()), want_causal(h.size());
    for (std::int64_t i = 0; i < 3; ++i) {
      const auto row = [&](std::int64_t len) {
        double mx = -std::numeric_limits<double>::infinity(), s = 0;
        for (std::int64_t j = 0; j < len; ++j) mx = std::max(mx, h[i * n + j]);
        for (std::int64_t j = 0; j < len; ++j) s += std::exp(h[i * n + j] - mx);
        return std::pair{mx, s};
      };
      const auto [mx, s] = row(n);
      const std::int64_t visible = std::min<std::int64_t>(i + 1, n);  // causal: query i sees j <= i
      const auto [cmx, cs] = row(visible);
      for (std::int64_t j = 0; j < n; ++j) {
        want[i * n + j] = std::exp(h[i * n + j] - mx) / s;
        want_log[i * n + j] = h[i * n + j] - mx - std::log(s);
        want_causal[i * n + j] = j < visible ? std::exp(h[i * n + j] - cmx) / cs : 0.0;
      }
    }
    const auto check = [&](const std::vector<float>& got, const std::vector<double>& w, const char* what) {
      INFO(what << ", rows of " << n);
      REQUIRE(got.size() == w.size());
      for (std::size_t k = 0; k < w.size(); ++k) REQUIRE(std::abs(got[k] - w[k]) <= tol * std::max(1.0, std::abs(w[k])));
    };
    const std::vector<float> hf(h.begin(), h.end());
    const auto x = mt::from_host<F>(m, {3, n}, hf);
    const auto xs = mt::from_host<Fs>(m, {3, n}, hf);
    check(mt::gather_all(mt::softmax<j_>(x)), want, "softmax");
    check(mt::gather_all(mt::softmax<j_>(xs)), want, "softmax, rows split over the ranks");
    check(mt::gather_all(mt::log_softmax<j_>(x)), want_log, "log_softmax");
    check(mt::gather_all(mt::causal_softmax<i_, j_>(x, 1.0)), want_causal, "causal_softmax (query i, along j)");
  }
  // A NaN anywhere in a row makes the whole row NaN; a row of -inf gives NaN too (0 / 0), as the
  // double path does, and a row of large values does not overflow.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> h(3 * 9, 0.5f);
  h[4] = nan;
  for (int j = 0; j < 9; ++j) h[9 + j] = -inf, h[18 + j] = 80.0f + j;
  const auto sm = mt::gather_all(mt::softmax<j_>(mt::from_host<F>(m, {3, 9}, h)));
  for (int j = 0; j < 9; ++j) {
    REQUIRE(std::isnan(sm[j]));
    REQUIRE(std::isnan(sm[9 + j]));
    REQUIRE(std::isfinite(sm[18 + j]));
  }
  REQUIRE(std::abs(sm[26] - 1 / (1 + 1 / std::exp(1.0) + 1 / std::exp(2.0) + 1 / std::exp(3.0) + 1 / std::exp(4.0) +
                                 1 / std::exp(5.0) + 1 / std::exp(6.0) + 1 / std::exp(7.0) + 1 / std::exp(8.0))) < 1e-6);
}
