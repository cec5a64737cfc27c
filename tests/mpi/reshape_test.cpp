// rename, replace_dimensions and reshape: errors name the dims, extents and axes on every rank; plans
// by hand (with the bytes of the reductions and reshape, from local sizes). Their sweep under every
// layout, which compiles in parallel, is reshape_test.layouts.cpp.
#include <catch2/matchers/catch_matchers_string.hpp>
#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
constexpr std::uint64_t seed = 11;
const std::array<std::int64_t, 2> ext{8, 12};
}  // namespace

TEST_CASE("reshape and rename errors name the dims, extents and axes, on every rank", "[reshape][equivalence]") {
  auto m = world_grid();
  // Every rank must throw; the allreduce afterwards proves none is left behind.
  auto all_threw = [](int threw) {
    int all = 0;
    MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
  };
  SECTION("product of extents differs") {
    using X = ten<mt::layout<grid, mt::split<i_, r_>>, i_, j_, k_>;
    const auto x = mt::random_normal<X>(m, {4, 8, 12}, seed);
    int threw = 0;
    try {
      (void)mt::reshape<i_, l_>(x, {4, 95});
    } catch (const mt::shape_error& e) {
      threw = 1;
      REQUIRE_THAT(std::string(e.what()), ContainsSubstring("tensor<i, j, k>[i=4, j=8, k=12]") &&
                                              ContainsSubstring("384") &&
                                              ContainsSubstring("tensor<i, l>[i=4, l=95]") &&
                                              ContainsSubstring("380"));
    }
    REQUIRE(all_threw(threw));
  }
  SECTION("a split dim kept by name moves in the row-major order") {
    using X = ten<mt::layout<grid, mt::split<k_, r_>>, i_, j_, k_>;
    const auto x = mt::random_normal<X>(m, {4, 8, 12}, seed);
    int threw = 0;
    try {
      // k keeps its extent but now has 4 elements before it instead of 32.
      (void)mt::reshape<i_, k_, l_>(x, {4, 12, 8});
    } catch (const mt::layout_error& e) {
      threw = 1;
      REQUIRE_THAT(std::string(e.what()), ContainsSubstring("dim 'k'") && ContainsSubstring("r(") &&
                                              ContainsSubstring("32 -> 4") &&
                                              ContainsSubstring("tensor<i, k, l>[i=4, k=12, l=8]"));
    }
    REQUIRE(all_threw(threw));
  }
  SECTION("rename onto a dim the layout cuts unevenly is no error") {
    using L = mt::layout<grid, mt::split<l_, r_, c_>>;
    using X = ten<L, i_, j_, k_>;
    const auto x = mt::random_normal<X>(m, {4, 8, 6}, seed);
    const auto y = mt::rename<k_, l_>(x);
    // 6 cut over r, then each part over c (nested balanced blocks): at [2x2] 3 + 3, then 2, 1, 2, 1.
    const auto c = m.communicator().coords();
    const std::int64_t R = m.size<r_>(), C = m.size<c_>();
    const std::int64_t over_r = 6 / R + (c[0] < 6 % R ? 1 : 0);
    const int right = y.local_extent<l_>() == over_r / C + (c[1] < over_r % C ? 1 : 0) ? 1 : 0;
    int everywhere = 0;  // agreed: a REQUIRE failing on some ranks only would hang the others
    MPI_Allreduce(&right, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    REQUIRE(everywhere == 1);
    REQUIRE(mt::gather_all(y) == mt::gather_all(x));
  }
}

TEST_CASE("rename and reshape plans, by hand; bytes of reductions and reshape from local sizes",
          "[reshape][comm_plan]") {
  auto m = world_grid();
  const unsigned r = grid::mask<r_>(), c = grid::mask<c_>();
  using mt::collective;
  using mt::layout;
  using mt::split;
  SECTION("rename: the new dim split like the old one moves nothing; otherwise data moves") {
    using Same = ten<layout<grid, split<j_, r_>, split<l_, r_>>, i_, j_>;
    using Other = ten<layout<grid, split<j_, r_>, split<l_, c_>>, i_, j_>;
    using Unsplit = ten<layout<grid, split<j_, r_>>, i_, j_>;
    using Swap = ten<layout<grid, split<i_, r_>>, i_, j_>;
    REQUIRE(mt::rename_plan<Same, j_, l_>().empty());
    REQUIRE(mt::rename_plan<Other, j_, l_>().as_counts() == counts({{collective::allgather, r, 1}}));
    REQUIRE(mt::rename_plan<Unsplit, j_, l_>().as_counts() == counts({{collective::allgather, r, 1}}));
    // (i, j) -> (j, i): the split on r moves from position 0 to position 1.
    REQUIRE(mt::replace_dimensions_plan<Swap, list<i_, j_>, list<j_, i_>>().as_counts() ==
            counts({{collective::alltoall, r, 1}}));
    const auto x = mt::random_normal<Same>(m, ext, 1);
    m.reset_counters();
    const auto y = mt::rename<j_, l_>(x);
    REQUIRE(m.counters().empty());
    REQUIRE(y.view().data() == x.view().data());  // the same slice, not even copied
  }
  SECTION("reshape: gathers the split dims it drops, keeps the ones it keeps") {
    using X = ten<layout<grid, split<i_, r_>, split<j_, c_>>, i_, j_>;
    using Keep = mt::detail::with_dims_t<X, list<i_, l_, m_>>;
    REQUIRE(mt::reshape_plan<Keep, X>().as_counts() == counts({{collective::allgather, c, 1}}));
    const auto x = mt::random_normal<X>(m, ext, 1);
    m.reset_counters();
    (void)mt::reshape<l_>(x, {96});
    const auto& got = m.counters();
    REQUIRE(got.size() == 1);
    REQUIRE(got.at({collective::allgather, r | c}).calls == 1);
    REQUIRE(got.at({collective::allgather, r | c}).bytes == x.local_size() * 8);
  }
  SECTION("reductions: one allreduce of the result's local slice; logsumexp two") {
    using X = ten<layout<grid, split<i_, r_>, split<j_, c_>>, i_, j_>;
    const auto x = mt::random_normal<X>(m, ext, 1);
    m.reset_counters();
    const auto mean = mt::reduce_mean<j_>(x);
    REQUIRE(m.counters().size() == 1);
    REQUIRE(m.counters().at({collective::allreduce, c}).bytes == mean.local_size() * 8);
    REQUIRE(mean.local_size() == x.local_extent<i_>());
    m.reset_counters();
    (void)mt::logsumexp<i_, j_>(x);
    REQUIRE(m.counters().size() == 1);
    REQUIRE(m.counters().at({collective::allreduce, r | c}).calls == 2);
    REQUIRE(m.counters().at({collective::allreduce, r | c}).bytes == 2 * 8);  // a scalar, twice
    m.reset_counters();
    (void)mt::softmax<i_>(x);
    REQUIRE(m.counters().at({collective::allreduce, r}).calls == 2);
    REQUIRE(m.counters().at({collective::allreduce, r}).bytes == 2 * x.local_extent<j_>() * 8);
  }
}
