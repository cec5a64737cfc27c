// rename, replace_dimensions and reshape under every layout (a TU of mpi_reshape_test: see
// reshape_test.cpp).
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
// As in reductions_test.softmax.cpp: even extents, then uneven over 2, 3, 4 and 6 parts.
std::array<std::int64_t, 2> ext{8, 12};
void choose_extents(bool uneven) {
  ext = uneven ? std::array<std::int64_t, 2>{13, 3} : std::array<std::int64_t, 2>{8, 12};
}
constexpr std::uint64_t seed = 11;

// rename / replace_dimensions / reshape only move or relabel data: the gathered result is the
// gathered input, element for element, whatever the layouts of input and result.
template <class M, class L>
void check_renames_and_reshapes(const M& m) {
  using X = ten<L, i_, j_>;
  INFO(layout_name<L>());
  const auto x = mt::random_normal<X>(m, ext, seed);
  const auto h = mt::gather_all(mt::random_normal<ten<mt::layout<M>, i_, j_>>(m, ext, seed));
  auto expect_same = [&](const auto& y, std::vector<std::int64_t> want_ext) {
    REQUIRE(std::vector<std::int64_t>(y.extents().begin(), y.extents().end()) == want_ext);
    REQUIRE(mt::gather_all(y) == h);
  };
  const auto [a, b] = ext;
  expect_same(mt::rename<j_, l_>(x), {a, b});
  expect_same(mt::rename<i_, i_>(x), {a, b});
  // All at once, so i and j swap names: the result's "j" has i's extent.
  expect_same(mt::replace_dimensions<list<i_, j_>, list<j_, i_>>(x), {a, b});
  expect_same(mt::replace_dimensions<list<i_>, list<l_>>(x), {a, b});
  expect_same(mt::reshape<l_>(x, {a * b}), {a * b});
  if (a == 8) {
    expect_same(mt::reshape<m_, n_, j_>(x, {2, 4, 12}), {2, 4, 12});  // j kept: local when j is split
    expect_same(mt::reshape<i_, l_, m_>(x, {8, 4, 3}), {8, 4, 3});    // i kept, l maybe newly split
    expect_same(mt::replace_dimensions<list<j_>, list<m_, l_>>(x, {3, 4}), {8, 3, 4});
  } else {
    expect_same(mt::reshape<m_, n_, j_>(x, {13, 1, 3}), {13, 1, 3});  // j kept, uneven parts
    expect_same(mt::reshape<i_, l_, m_>(x, {13, 3, 1}), {13, 3, 1});  // i kept, l maybe newly split
    expect_same(mt::replace_dimensions<list<i_>, list<m_, l_>>(x, {1, 13}), {1, 13, 3});
  }
}
}  // namespace

// Layouts over i, j and l: the result's l (new in rename and reshape) is split where the input's
// dims were not, or over other axes, so data must move or be sliced.
TEST_CASE("rename, replace_dimensions and reshape keep the row-major elements, every layout",
          "[reshape][equivalence]") {
  choose_extents(GENERATE(false, true));
  INFO("extents " << ext[0] << " x " << ext[1]);
  SECTION("mesh [P]") {
    auto m = world_line();
    for_each_type(line_layouts<line, i_, j_, l_>{}, [&]<class L>() { check_renames_and_reshapes<line, L>(m); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto m = world_grid();
    for_each_type(grid_layouts<i_, j_, l_>{}, [&]<class L>() { check_renames_and_reshapes<grid, L>(m); });
  }
}
