// Layout transparency of slice, pad, concat, split_along, shift, halo_exchange, one_hot, gather,
// cumsum and top_k: under every layout of meshes [P] and [2x2] over the inputs' dims, the gathered
// result equals the result under the replicated layout AND an independent host loop over the
// gathered inputs. Data movement is compared exactly; sums (cumsum) to 1e-12 relative.
// Compile time: the full layout sweep runs in Kokkos::DefaultExecutionSpace only; every space of
// MESHTENSOR_TEST_SPACES runs a smoke test of all ops under one split layout.
#include <algorithm>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <map>
#include <numeric>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
constexpr double tol = 1e-12;
// x[i, j, k]: the ops act along j (a middle dim, so that both outer and inner extents matter).
// Each test runs with even extents (4, 16, 4: every result extent divides by 4 parts) and uneven
// ones (3, 13, 5: uneven over 2, 3, 4 and 6 parts, and i has fewer elements than 4 or 6 parts, so
// some processors hold nothing); slices cut through parts either way.
constexpr std::int64_t KTOP = 4;
std::int64_t I = 4, J = 16, K = 4;
std::array<std::int64_t, 3> ext{I, J, K};
// Called at the top of each test case: GENERATE runs it once per extent set.
void choose_extents(bool uneven) {
  I = uneven ? 3 : 4;
  J = uneven ? 13 : 16;
  K = uneven ? 5 : 4;
  ext = {I, J, K};
}

// top_k's new dim is tst::l_.

using host = std::vector<double>;
using results = std::map<std::string, host>;

// out[i, jn, k] = f(i, jn, k) over a [I, Jn, K] array.
template <class F>
host build(std::int64_t jn, F f) {
  host out(static_cast<std::size_t>(I * jn * K));
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < jn; ++j)
      for (std::int64_t k = 0; k < K; ++k) out[(i * jn + j) * K + k] = f(i, j, k);
  return out;
}
std::int64_t wrap_index(std::int64_t s, std::int64_t n) { return ((s % n) + n) % n; }

// ids for gather (with repeats) and one_hot (with out-of-range values, which give `off` rows).
std::vector<std::int32_t> gather_ids() {
  std::vector<std::int32_t> v{5, 0, static_cast<std::int32_t>(J - 1), 5};
  v.resize(static_cast<std::size_t>(I));
  return v;
}
std::vector<std::int32_t> one_hot_ids() {
  std::vector<std::int32_t> v(static_cast<std::size_t>(I * J));
  for (std::size_t n = 0; n < v.size(); ++n) v[n] = static_cast<std::int32_t>((n * 7) % 6) - 1;  // -1 .. 4
  return v;
}

// The host loops, from the gathered inputs alone.
results host_reference(const host& x, const host& y, const host& table) {
  auto at = [&](const host& a, std::int64_t jn, std::int64_t i, std::int64_t j, std::int64_t k) {
    return a[(i * jn + j) * K + k];
  };
  results r;
  r["slice"] = build(8, [&](auto i, auto j, auto k) { return at(x, J, i, j + 2, k); });
  r["pad"] = build(J + 4, [&](auto i, auto j, auto k) { return j >= 1 && j < J + 1 ? at(x, J, i, j - 1, k) : 0.0; });
  r["concat"] = build(J + 4, [&](auto i, auto j, auto k) { return j < J ? at(x, J, i, j, k) : at(y, 4, i, j - J, k); });
  r["split0"] = build(4, [&](auto i, auto j, auto k) { return at(x, J, i, j, k); });
  r["split1"] = build(J - 8, [&](auto i, auto j, auto k) { return at(x, J, i, j + 4, k); });
  r["split2"] = build(4, [&](auto i, auto j, auto k) { return at(x, J, i, j + J - 4, k); });
  for (std::int64_t off : {3, -2, 11, -13})
    for (bool wrap : {false, true})
      r["shift" + std::to_string(off) + (wrap ? "w" : "z")] = build(J, [&](auto i, auto j, auto k) {
        const std::int64_t s = j - off;
        if (wrap) return at(x, J, i, wrap_index(s, J), k);
        return s >= 0 && s < J ? at(x, J, i, s, k) : 0.0;
      });
  r["cumsum"] = build(J, [&](auto i, auto j, auto k) {
    double acc = 0;
    for (std::int64_t t = 0; t <= j; ++t) acc += at(x, J, i, t, k);
    return acc;
  });
  // top_k over j for every (i, k): values [i, k, l] and indices, ties (none expected) to the lower index.
  host tv(I * K * KTOP), ti(I * K * KTOP);
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t k = 0; k < K; ++k) {
      std::vector<std::int64_t> order(J);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return at(x, J, i, a, k) > at(x, J, i, b, k); });
      for (std::int64_t t = 0; t < KTOP; ++t) {
        tv[(i * K + k) * KTOP + t] = at(x, J, i, order[t], k);
        ti[(i * K + k) * KTOP + t] = static_cast<double>(order[t]);
      }
    }
  r["top_k.values"] = tv;
  r["top_k.indices"] = ti;
  // one_hot<k>(ids[i, j], depth K, on 2.5, off -1): [i, j, k].
  const auto oh = one_hot_ids();
  host o(I * J * K);
  for (std::int64_t n = 0; n < I * J; ++n)
    for (std::int64_t c = 0; c < K; ++c) o[n * K + c] = oh[n] == c ? 2.5 : -1.0;
  r["one_hot"] = o;
  // gather<j>(table[j, k], ids[i]) -> [i, k].
  host gt(I * K);
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t k = 0; k < K; ++k) gt[i * K + k] = table[gather_ids()[i] * K + k];
  r["gather"] = gt;
  return r;
}

// gather needs V's axes to split none of the indices' dims (a compile-time error otherwise).
template <class L>
constexpr bool gather_ok = (L::template split_of<j_>().mask() & L::template split_of<i_>().mask()) == 0;

template <class V>
host to_double(const std::vector<V>& v) {
  return host(v.begin(), v.end());
}

// Runs every op under layout L and returns the gathered results; checks halo_exchange's local
// result here, against the gathered input.
template <class Exec, class L, class M>
results run_ops(const M& g) {
  using X = mt::basic_tensor<double, L, Exec, i_, j_, k_>;
  auto x = mt::random_normal<X>(g, ext, 11);
  auto y = mt::random_normal<X>(g, {I, 4, K}, 12);
  results r;
  r["slice"] = mt::gather_all(mt::slice<j_>(x, 2, 8));
  r["pad"] = mt::gather_all(mt::pad<j_>(x, 1, 3));
  r["concat"] = mt::gather_all(mt::concat<j_>(x, y));
  auto pieces = mt::split_along<j_>(x, 4, J - 8, 4);
  for (std::size_t p = 0; p < pieces.size(); ++p) r["split" + std::to_string(p)] = mt::gather_all(pieces[p]);
  for (std::int64_t off : {3, -2, 11, -13})
    for (bool wrap : {false, true})
      r["shift" + std::to_string(off) + (wrap ? "w" : "z")] =
          mt::gather_all(mt::shift<j_>(x, off, wrap ? mt::boundary::wrap : mt::boundary::zero_fill));
  r["cumsum"] = mt::gather_all(mt::cumsum<j_>(x));
  auto tk = mt::top_k<j_, l_>(x, KTOP);
  r["top_k.values"] = mt::gather_all(tk.values);
  r["top_k.indices"] = to_double(mt::gather_all(tk.indices));
  using Ids2 = mt::basic_tensor<std::int32_t, L, Exec, i_, j_>;
  const auto oh = one_hot_ids();
  r["one_hot"] = mt::gather_all(mt::one_hot<k_, double>(mt::from_host<Ids2>(g, {I, J}, oh), K, 2.5, -1.0));
  if constexpr (gather_ok<L>) {
    using Table = mt::basic_tensor<double, L, Exec, j_, k_>;
    using Ids = mt::basic_tensor<std::int32_t, L, Exec, i_>;
    auto table = mt::random_normal<Table>(g, {J, K}, 13);
    r["gather"] = mt::gather_all(mt::gather<j_>(table, mt::from_host<Ids>(g, {I}, gather_ids())));
  }

  // halo_exchange: this rank's slice along j widened by 3 (zeros / wrapped at the ends).
  const auto xh = mt::gather_all(x);
  for (bool wrap : {false, true}) {
    constexpr std::int64_t w = 3;
    const auto h = mt::halo_exchange<j_>(x, w, wrap ? mt::boundary::wrap : mt::boundary::zero_fill);
    const auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h.view());
    const auto le = x.local_extents();
    const auto off = x.offsets();
    REQUIRE(h.local_extents[1] == le[1] + 2 * w);
    REQUIRE(h.begin == off[1] - w);
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < le[0]; ++i)
      for (std::int64_t j = 0; j < le[1] + 2 * w; ++j)
        for (std::int64_t k = 0; k < le[2]; ++k) {
          std::int64_t s = off[1] - w + j;
          double want = 0;
          if (wrap) s = wrap_index(s, J);
          if (s >= 0 && s < J) want = xh[((off[0] + i) * J + s) * K + off[2] + k];
          if (hv(h.flat({i, j, k})) != want) ++mismatches;
        }
    INFO("halo_exchange wrap=" << wrap);
    REQUIRE(mismatches == 0);
  }
  return r;
}

void require_same(const results& got, const results& want, const char* against) {
  for (const auto& [name, values] : got) {
    INFO(name << " against " << against);
    REQUIRE(want.count(name) == 1);
    REQUIRE(max_rel_error(values, want.at(name)) <= tol);
  }
}

template <class Exec, class M>
results reference_of(const M& g) {
  using X = mt::basic_tensor<double, mt::layout<M>, Exec, i_, j_, k_>;
  using Table = mt::basic_tensor<double, mt::layout<M>, Exec, j_, k_>;
  return host_reference(mt::gather_all(mt::random_normal<X>(g, ext, 11)),
                        mt::gather_all(mt::random_normal<X>(g, {I, 4, K}, 12)),
                        mt::gather_all(mt::random_normal<Table>(g, {J, K}, 13)));
}

template <class Exec, class M, class Layouts>
void check_all_layouts(const M& g, Layouts layouts) {
  const auto want = reference_of<Exec>(g);
  const auto replicated = run_ops<Exec, mt::layout<M>>(g);
  REQUIRE(replicated.size() == want.size());
  require_same(replicated, want, "host loop");
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    const auto got = run_ops<Exec, L>(g);
    REQUIRE(got.size() == want.size() - (gather_ok<L> ? 0 : 1));
    require_same(got, replicated, "the replicated layout");
    require_same(got, want, "host loop");
  });
}

// Extra layouts that split top_k's new dim l as well.
using line_extra = list<mt::layout<line, mt::split<l_, x_>>, mt::layout<line, mt::split<j_, x_>, mt::split<l_, x_>>>;
using grid_extra = list<mt::layout<grid, mt::split<j_, r_, c_>, mt::split<l_, c_, r_>>,
                        mt::layout<grid, mt::split<k_, r_>, mt::split<l_, c_>>>;
}  // namespace

TEST_CASE("slice/pad/concat/split_along/shift/halo/one_hot/gather/cumsum/top_k are layout-independent",
          "[equivalence]") {
  choose_extents(GENERATE(false, true));
  INFO("extents " << I << " x " << J << " x " << K);
  using E = Kokkos::DefaultExecutionSpace;
  SECTION("mesh [P]") {
    check_all_layouts<E>(world_line(), tst::detail::concat<line_layouts<line, i_, j_, k_>, line_extra>::type{});
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    check_all_layouts<E>(world_grid(), tst::detail::concat<grid_layouts<i_, j_, k_>, grid_extra>::type{});
  }
}

TEMPLATE_TEST_CASE("data movement: smoke in every execution space", "[equivalence]", MESHTENSOR_TEST_SPACES) {
  choose_extents(GENERATE(false, true));
  auto g = world_grid();
  require_same(run_ops<TestType, mt::layout<grid, mt::split<j_, c_, r_>, mt::split<l_, r_>>>(g),
               reference_of<TestType>(g), "host loop");
}

// stencil with a device lambda (as a user writes it; nvcc compiles this file in cuda_build), a 5-point
// update along j and k wrapped around, against a host loop (stencil_test.cpp sweeps the layouts).
template <class Exec>
void check_stencil_lambda() {
  auto g = world_grid();
  using X = mt::basic_tensor<double, mt::layout<grid, mt::split<j_, c_, r_>>, Exec, i_, j_, k_>;
  const auto x = mt::random_normal<X>(g, ext, 31), c = mt::random_normal<X>(g, ext, 32);
  const auto got = mt::gather_all(mt::stencil<j_, k_>(
      x, 1, mt::boundary::wrap,
      KOKKOS_LAMBDA(const mt::stencil_neighbours<double, 2>& at, double cc) {
        return at(-1, 0) + at(1, 0) * 2.0 - at(0, -1) * cc + at(0, 1) - at(0, 0) * 4.0;
      },
      c));
  const auto xh = mt::gather_all(x), ch = mt::gather_all(c);
  const auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) {
    return xh[std::size_t((i * J + wrap_index(j, J)) * K + wrap_index(k, K))];
  };
  REQUIRE(got == build(J, [&](std::int64_t i, std::int64_t j, std::int64_t k) {
            return at(i, j - 1, k) + at(i, j + 1, k) * 2.0 - at(i, j, k - 1) * ch[std::size_t((i * J + j) * K + k)] +
                   at(i, j, k + 1) - at(i, j, k) * 4.0;
          }));
}

TEMPLATE_TEST_CASE("stencil: a device lambda in every execution space", "[equivalence]", MESHTENSOR_TEST_SPACES) {
  choose_extents(GENERATE(false, true));
  check_stencil_lambda<TestType>();
}

TEST_CASE("data movement errors are raised on every rank alike, naming dims and extents", "[equivalence]") {
  choose_extents(false);
  auto g = world_line();
  using L = mt::layout<line, mt::split<j_, x_>>;
  using X = mt::tensor<double, L, i_, j_, k_>;
  auto x = mt::random_normal<X>(g, ext, 1);
  const int p = g.nprocs();
  // Every rank must throw; the allreduce afterwards proves that none is left behind.
  auto all_threw = [](bool threw) {
    int t = threw ? 1 : 0, all = 0;
    MPI_Allreduce(&t, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
  };
  // A result extent that does not divide by the parts is no error: it is split unevenly.
  REQUIRE(mt::slice<j_>(x, 0, 5).extents() == std::array<std::int64_t, 3>{I, 5, K});
  {
    bool threw = false;
    try {
      (void)mt::slice<j_>(x, 10, 8);
    } catch (const mt::shape_error& e) {
      threw = true;
      REQUIRE_THAT(std::string(e.what()), ContainsSubstring("'j'") && ContainsSubstring("extent 16"));
    }
    REQUIRE(all_threw(threw));
  }
  {
    // One bad id, held by only the last rank when i is split: every rank must still throw.
    using LI = mt::layout<line, mt::split<i_, x_>>;
    using Table = mt::tensor<double, LI, j_, k_>;
    using Ids = mt::tensor<std::int32_t, LI, i_>;
    auto table = mt::random_normal<Table>(g, {J, K}, 2);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(4 * p), 1);
    ids.back() = static_cast<std::int32_t>(J);
    bool threw = false;
    try {
      (void)mt::gather<j_>(table, mt::from_host<Ids>(g, {4 * p}, ids));
    } catch (const mt::error& e) {
      threw = true;
      REQUIRE_THAT(std::string(e.what()), ContainsSubstring("[0, 16)") && ContainsSubstring("'j'"));
    }
    REQUIRE(all_threw(threw));
  }
}
