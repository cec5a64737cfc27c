#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

TEST_CASE("names are types whose name() is the string they were declared with", "[names]") {
  STATIC_REQUIRE(mt::Dim<i_>);
  STATIC_REQUIRE(mt::Axis<x_>);
  STATIC_REQUIRE(!mt::Dim<x_>);
  STATIC_REQUIRE(!mt::Axis<i_>);
  REQUIRE(i_::name() == "i");
  REQUIRE(r_::name() == "r");
}

TEST_CASE("type-level set algebra keeps order and finds positions", "[names]") {
  using a = list<i_, j_, k_>;
  using b = list<k_, l_, i_>;
  STATIC_REQUIRE(std::is_same_v<mt::union_t<a, b>, list<i_, j_, k_, l_>>);
  STATIC_REQUIRE(std::is_same_v<mt::union_t<b, a>, list<k_, l_, i_, j_>>);
  STATIC_REQUIRE(std::is_same_v<mt::difference_t<a, b>, list<j_>>);
  STATIC_REQUIRE(std::is_same_v<mt::intersection_t<a, b>, list<i_, k_>>);
  STATIC_REQUIRE(mt::index_of_v<k_, a> == 2);
  STATIC_REQUIRE(mt::index_of_v<l_, a> == 3);
  STATIC_REQUIRE(mt::contains_v<j_, a>);
  STATIC_REQUIRE(!mt::contains_v<l_, a>);
  STATIC_REQUIRE(mt::distinct_v<a>);
  STATIC_REQUIRE(!mt::distinct_v<list<i_, j_, i_>>);
  STATIC_REQUIRE(mt::count_v<i_, list<i_, j_, i_>> == 2);
}

TEST_CASE("layout rules give each dim its axes in the rule's order", "[layout]") {
  using L = mt::layout<grid, mt::split<i_, c_, r_>, mt::split<k_, r_>>;
  STATIC_REQUIRE(std::is_same_v<L::axes_of<i_>, list<c_, r_>>);
  STATIC_REQUIRE(std::is_same_v<L::axes_of<j_>, list<>>);
  constexpr auto s = L::split_of<i_>();
  STATIC_REQUIRE(s.count == 2);
  STATIC_REQUIRE(s.axes[0] == 1);  // c is the grid's second axis
  STATIC_REQUIRE(s.axes[1] == 0);
  STATIC_REQUIRE(s.mask() == 3u);
  STATIC_REQUIRE(L::split_of<k_>().mask() == 1u);
}

TEST_CASE("a rank-0 tensor holds one element and sums to itself", "[tensor]") {
  auto g = world_line();
  using S = mt::tensor<double, mt::layout<line>>;
  auto s = mt::full<S>(g, {}, 2.5);
  REQUIRE(s.local_size() == 1);
  REQUIRE(mt::gather_all(s) == std::vector<double>{2.5});
}
