// update_slice<D>(into, x, offset): the gathered result equals a host loop under a few layouts
// of meshes [P] and [2x2] (the written dim j split or not, uneven extents, writes that cross
// parts), communicates its plan (an allgather of x over j's axes, none when j is not split), and
// throws, on every rank alike, for a range outside j's extent and on tensors on the tape.
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
// j uneven over 2, 3, 4 and 6 parts; i has fewer elements than 4 or 6 parts.
constexpr std::int64_t I = 3, J = 13, K = 5;

template <class L, class M>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, i_, j_, k_>;
  constexpr unsigned j_axes = L::template split_of<j_>().mask();
  const mt::no_grad inference;
  for (const std::int64_t s : {1, 4})
    for (const std::int64_t offset : {std::int64_t{0}, std::int64_t{5}, J - s}) {
      INFO("extent " << s << " at " << offset);
      auto into = mt::random_normal<X>(g, {I, J, K}, 1);
      const auto x = mt::random_normal<X>(g, {I, s, K}, 2);
      const auto before = mt::gather_all(into);
      const auto xh = mt::gather_all(x);
      const X copy = into;  // shares into's data, so it sees the write
      g.reset_counters();
      mt::update_slice<j_>(into, x, offset);
      require_counts(g, mt::update_slice_plan<X, j_>());
      // The allgather moves x only, never the buffer it is written into.
      if constexpr (j_axes != 0) {
        const auto it = g.counters().find({mt::collective::allgather, j_axes});
        REQUIRE(it != g.counters().end());
        REQUIRE(it->second.bytes == x.local_size() * std::int64_t(sizeof(double)));
      }
      const auto got = mt::gather_all(into);
      REQUIRE(mt::gather_all(copy) == got);
      std::int64_t mismatches = 0;
      for (std::int64_t i = 0; i < I; ++i)
        for (std::int64_t j = 0; j < J; ++j)
          for (std::int64_t k = 0; k < K; ++k) {
            const bool written = j >= offset && j < offset + s;
            const double want = written ? xh[(i * s + j - offset) * K + k] : before[(i * J + j) * K + k];
            if (got[(i * J + j) * K + k] != want) ++mismatches;
          }
      REQUIRE(mismatches == 0);
    }
}
}  // namespace

TEST_CASE("update_slice writes in place, under split and unsplit layouts", "[equivalence][comm_plan]") {
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
  STATIC_REQUIRE(mt::update_slice_plan<mt::tensor<double, mt::layout<grid>, i_, j_, k_>, j_>().empty());
}

TEST_CASE("update_slice's errors name the dim, offset and extent, on every rank alike", "[equivalence]") {
  auto g = world_line();
  using X = mt::tensor<double, mt::layout<line, mt::split<j_, x_>>, i_, j_, k_>;
  auto into = mt::random_normal<X>(g, {I, J, K}, 1);
  const auto x = mt::random_normal<X>(g, {I, 4, K}, 2);
  for (const std::int64_t offset : {std::int64_t{-1}, J - 3}) {
    INFO("offset " << offset);
    try {
      mt::update_slice<j_>(into, x, offset);
      FAIL("no error");
    } catch (const mt::shape_error& e) {
      REQUIRE_THAT(std::string(e.what()), ContainsSubstring("'j'") && ContainsSubstring("offset " + std::to_string(offset)) &&
                                              ContainsSubstring("extent 13"));
    }
  }
  const auto wrong = mt::random_normal<X>(g, {I, 4, K + 1}, 3);
  REQUIRE_THROWS_WITH(mt::update_slice<j_>(into, wrong, 0), ContainsSubstring("'k'"));
  // No gradient: on the tape it throws rather than leave a backward pass reading overwritten data.
  auto w = mt::random_normal<X>(g, {I, 4, K}, 4);
  w.requires_grad();
  REQUIRE_THROWS_WITH(mt::update_slice<j_>(into, w, 0), ContainsSubstring("no gradient"));
  {
    const mt::no_grad off;
    mt::update_slice<j_>(into, w, 0);  // x's values only: allowed
  }
  REQUIRE_THROWS_WITH(mt::update_slice<j_>(w, x, 0), ContainsSubstring("no gradient"));
}
