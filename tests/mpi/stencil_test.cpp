// stencil<Ds...>: under every layout of meshes [P] and [2x2] over x[i, j, k], a stencil along j and
// k of width 2 (corners read) with a field, zero-filled and wrapped, equals a host loop over the
// gathered input exactly (the same arithmetic per point). Uneven extents (3, 13, 5) put every path
// in play: k's parts of 1 or 2 over 4 processors take the allgather, j's the neighbours' faces, i
// leaves some processors empty. Also: the collectives counted, and the refusals (every rank alike).
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
std::int64_t I = 4, J = 16, K = 4;
std::array<std::int64_t, 3> ext{I, J, K};
void choose_extents(bool uneven) {
  I = uneven ? 3 : 4;
  J = uneven ? 13 : 16;
  K = uneven ? 5 : 4;
  ext = {I, J, K};
}

// The point update: neighbours up to 2 away along j and k, a corner among them, and the field.
struct update {
  KOKKOS_INLINE_FUNCTION double operator()(const auto& at, double c) const {
    return (at(-2, 1) + at(1, -1) * 0.5 + at(0, 0) * 2.0 - at(2, 2)) * c + at(0, -2);
  }
};

std::vector<double> host_stencil(const std::vector<double>& x, const std::vector<double>& c, bool wrap) {
  const auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) {
    if (wrap) {
      j = ((j % J) + J) % J;
      k = ((k % K) + K) % K;
    }
    return j < 0 || j >= J || k < 0 || k >= K ? 0.0 : x[std::size_t((i * J + j) * K + k)];
  };
  std::vector<double> out(x.size());
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < J; ++j)
      for (std::int64_t k = 0; k < K; ++k) {
        const double cc = c[std::size_t((i * J + j) * K + k)];
        out[std::size_t((i * J + j) * K + k)] =
            (at(i, j - 2, k + 1) + at(i, j + 1, k - 1) * 0.5 + at(i, j, k) * 2.0 - at(i, j + 2, k + 2)) * cc +
            at(i, j, k - 2);
      }
  return out;
}

template <class L, class M>
void check_layout(const M& g) {
  using X = mt::tensor<double, L, i_, j_, k_>;
  const auto x = mt::random_normal<X>(g, ext, 21);
  const auto c = mt::random_normal<X>(g, ext, 22);
  const auto xh = mt::gather_all(x), ch = mt::gather_all(c);
  for (bool wrap : {false, true}) {
    INFO(layout_name<L>() << (wrap ? ", wrap" : ", zero_fill"));
    const auto got = mt::gather_all(mt::stencil<j_, k_>(x, 2, wrap ? mt::boundary::wrap : mt::boundary::zero_fill, update{}, c));
    REQUIRE(got == host_stencil(xh, ch, wrap));
  }
}
}  // namespace

TEST_CASE("stencil equals a host loop over the gathered input under every layout", "[equivalence]") {
  choose_extents(GENERATE(false, true));
  INFO("extents " << I << " x " << J << " x " << K);
  SECTION("mesh [P]") {
    for_each_type(line_layouts<line, i_, j_, k_>{}, [&]<class L>() { check_layout<L>(world_line()); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    for_each_type(grid_layouts<i_, j_, k_>{}, [&]<class L>() { check_layout<L>(world_grid()); });
  }
}

TEST_CASE("stencil moves faces between neighbours: two shifts per split dim", "[comm_plan]") {
  choose_extents(false);
  auto g = world_grid();
  using L = mt::layout<grid, mt::split<j_, r_>, mt::split<k_, c_>>;
  using X = mt::tensor<double, L, i_, j_, k_>;
  const auto x = mt::random_normal<X>(g, ext, 3);
  g.reset_counters();
  (void)mt::stencil<j_, k_>(x, 1, mt::boundary::zero_fill, [](const auto& at) { return at(1, 0) - at(0, -1); });
  // Faces of one element, whole along i and (for k's pass) along j's widened extent: bytes too.
  const auto le = x.local_extents();
  const unsigned r = grid::mask<r_>(), c = grid::mask<c_>();
  require_counts(g.counters(), counts({{mt::collective::shift, r, 2}, {mt::collective::shift, c, 2}}));
  const std::int64_t word = sizeof(double);
  REQUIRE(g.counters().at({mt::collective::shift, r}).bytes == 2 * le[0] * (le[2] + 2) * word);
  REQUIRE(g.counters().at({mt::collective::shift, c}).bytes == 2 * le[0] * (le[1] + 2) * word);
}

TEST_CASE("stencil refuses bad input on every rank alike, naming dims and extents", "[equivalence]") {
  choose_extents(false);
  auto g = world_line();
  using X = mt::tensor<double, mt::layout<line, mt::split<j_, x_>>, i_, j_, k_>;
  auto x = mt::random_normal<X>(g, ext, 1);
  const auto one = [](const auto& at) { return at(0); };
  auto all_threw = [](bool threw) {
    int t = threw ? 1 : 0, all = 0;
    MPI_Allreduce(&t, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
  };
  const auto refused = [&](auto&& call, std::initializer_list<const char*> words) {
    bool threw = false;
    try {
      call();
    } catch (const mt::error& e) {
      threw = true;
      for (const char* w : words) REQUIRE_THAT(std::string(e.what()), ContainsSubstring(w));
    }
    return all_threw(threw);
  };
  REQUIRE(refused([&] { (void)mt::stencil<j_>(x, -1, mt::boundary::zero_fill, one); }, {"'j'", "negative width -1"}));
  REQUIRE(refused([&] { (void)mt::stencil<j_, k_>(x, std::int64_t{1} << 40, mt::boundary::wrap, [](const auto& at) { return at(0, 0); }); },
                  {"'j', 'k'", "width 1099511627776", "past 2^63"}));
  const auto other = mt::random_normal<X>(g, {I, J + 1, K}, 2);
  REQUIRE(refused([&] { (void)mt::stencil<j_>(x, 1, mt::boundary::zero_fill, [](const auto& at, double) { return at(0); }, other); },
                  {"'j'", "17", "differs in extents"}));
  x.requires_grad();
  REQUIRE(refused([&] { (void)mt::stencil<j_>(x, 1, mt::boundary::zero_fill, one); }, {"'j'", "no gradient", "no_grad"}));
}
