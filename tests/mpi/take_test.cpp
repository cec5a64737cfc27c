// take<D>(x, index): the gathered result equals a host loop under layouts of meshes [P] and [2x2]
// (the taken dim j split over one axis, two, or not at all; uneven parts), for indices that stay
// within each processor's part (repeated: nothing communicated) and indices that cross parts (a
// reversal, a shorter and a longer index with repeats: one allgather over j's axes); its gradient
// (a scatter-add) equals central finite differences on both paths; an index outside j's extent
// throws, naming the dim, the index and the extent; an index that differs between ranks throws on
// every rank, plans checked or not, instead of leaving some in the allgather.
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
// j uneven over 2, 3, 4 and 6 parts.
constexpr std::int64_t I = 3, J = 13, K = 5;

// Each row r of j taken from the first row of the part that holds r: repeated indices that never
// leave a processor's part.
template <class X>
std::vector<std::int64_t> within_parts(const X& x) {
  constexpr std::size_t d = X::template index_of<j_>();
  const auto p = x.placement();
  std::vector<std::int64_t> index(static_cast<std::size_t>(x.template extent<j_>()));
  for (std::size_t r = 0; r < index.size(); ++r) index[r] = p.part_offset(d, p.part_of(d, static_cast<std::int64_t>(r)));
  return index;
}

template <class L, class M>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, i_, j_, k_>;
  const auto x = mt::random_normal<X>(g, {I, J, K}, 1);
  const auto xh = mt::gather_all(x);
  const bool j_split = x.placement().parts(X::template index_of<j_>()) > 1;
  std::vector<std::int64_t> reversed(J);
  for (std::int64_t r = 0; r < J; ++r) reversed[r] = J - 1 - r;
  const std::vector<std::pair<std::vector<std::int64_t>, bool>> cases{
      {within_parts(x), false},
      {reversed, j_split},
      {{12, 3, 3, 0, 7}, j_split},
      {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 12, 12, 0}, j_split}};
  for (const auto& [index, crosses] : cases) {
    const auto m = static_cast<std::int64_t>(index.size());
    INFO("index of " << m << (crosses ? ", crossing parts" : ", within parts"));
    g.reset_counters();
    const auto out = mt::take<j_>(x, index);
    require_counts(g, crosses ? mt::take_gathered_plan<X, j_>() : mt::take_plan<X, j_>());
    REQUIRE(out.template extent<j_>() == m);
    const auto got = mt::gather_all(out);
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t r = 0; r < m; ++r)
        for (std::int64_t k = 0; k < K; ++k)
          if (got[(i * m + r) * K + k] != xh[(i * J + index[r]) * K + k]) ++mismatches;
    REQUIRE(mismatches == 0);
  }
}

template <class L, class M>
void check_gradient(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, i_, j_, k_>;
  const typename X::extents_type e{I, J, K};
  const auto within = within_parts(mt::random_normal<X>(g, e, 0));
  check_grad_at_normal<X>("take (within parts)", g, e, 1, [&](const X& x) { return weighted_sum(mt::take<j_>(x, within), 2); });
  const std::vector<std::int64_t> crossing{12, 3, 3, 0, 7, 3};
  check_grad_at_normal<X>("take (crossing parts)", g, e, 3, [&](const X& x) { return weighted_sum(mt::take<j_>(x, crossing), 4); });
}
}  // namespace

TEST_CASE("take picks rows along a dim, communicating only when they cross parts", "[equivalence][comm_plan]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_layout<mt::layout<line>>(g);
    check_layout<mt::layout<line, mt::split<j_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<i_, x_>>>(g);
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto g = world_grid();
    check_layout<mt::layout<grid, mt::split<j_, c_, r_>>>(g);
    check_layout<mt::layout<grid, mt::split<j_, r_>, mt::split<k_, c_>>>(g);
  }
  STATIC_REQUIRE(mt::take_gathered_plan<mt::tensor<double, mt::layout<grid>, i_, j_, k_>, j_>().empty());
}

TEST_CASE("take's gradient adds rows back where they came from", "[gradient]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_gradient<mt::layout<line>>(g);
    check_gradient<mt::layout<line, mt::split<j_, x_>>>(g);
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto g = world_grid();
    check_gradient<mt::layout<grid, mt::split<j_, c_, r_>>>(g);
    check_gradient<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>>(g);
  }
}

TEST_CASE("take's error names the dim, the index and the extent, on every rank alike", "[equivalence]") {
  auto g = world_line();
  using X = mt::tensor<double, mt::layout<line, mt::split<j_, x_>>, i_, j_, k_>;
  const auto x = mt::random_normal<X>(g, {I, J, K}, 1);
  for (const std::int64_t bad : {std::int64_t{-1}, J}) {
    INFO("index " << bad);
    try {
      (void)mt::take<j_>(x, {0, bad});
      FAIL("no error");
    } catch (const mt::shape_error& e) {
      REQUIRE_THAT(std::string(e.what()), ContainsSubstring("'j'") && ContainsSubstring("index[1] = " + std::to_string(bad)) &&
                                              ContainsSubstring("[0, 13)"));
    }
  }
}

TEST_CASE("take refuses an index that differs between ranks, on every rank alike, with plans unchecked", "[equivalence]") {
  auto g = world_line();
  if (g.nprocs() < 2) SKIP("one rank: nothing to differ");
  // Plans unchecked, as users run: the agreement is not part of the plan check.
  struct plans_off {
    bool was = mt::detail::plans_checked_switch();
    plans_off() { mt::detail::plans_checked_switch() = false; }
    ~plans_off() { mt::detail::plans_checked_switch() = was; }
  } off;
  using X = mt::tensor<double, mt::layout<line, mt::split<j_, x_>>, i_, j_, k_>;
  const auto x = mt::random_normal<X>(g, {I, J, K}, 1);
  // The last rank reverses two rows the others keep: the same length, the same values, another order.
  const bool last = g.rank() == g.nprocs() - 1;
  const std::vector<std::int64_t> index = last ? std::vector<std::int64_t>{J - 1, 0} : std::vector<std::int64_t>{0, J - 1};
  try {
    (void)mt::take<j_>(x, index);
    FAIL("no error");
  } catch (const mt::shape_error& e) {
    REQUIRE_THAT(std::string(e.what()), ContainsSubstring("'j'") && ContainsSubstring("differs between processors"));
  }
  // Out of range on the last rank only: the agreement comes first, so no rank throws alone.
  try {
    (void)mt::take<j_>(x, {last ? J : 0});
    FAIL("no error");
  } catch (const mt::shape_error& e) {
    REQUIRE_THAT(std::string(e.what()), ContainsSubstring("differs between processors"));
  }
  // The same index everywhere still runs.
  REQUIRE(mt::take<j_>(x, {0, J - 1}).template extent<j_>() == 2);
}
