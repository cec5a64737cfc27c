#pragma once
// The layout sweep of one family of ops, shared by elementwise_test.cpp (unary ops),
// elementwise_test.binary.cpp, einsum_test.layouts.cpp and reductions_test.cpp (reduce_sum and
// transpose), each a TU of its own that compiles in under 2 GB: extents, the sweep, and its two
// test cases.
#include <test_support.hpp>

namespace tst::op_family {
namespace mt = meshtensor;
constexpr double tol = 1e-12;
// Set per run (GENERATE): even extents, and uneven ones over 2, 3, 4 and 6 parts, with one (2)
// smaller than 3, 4 or 6 parts so that some processors hold nothing.
inline std::array<std::int64_t, 3> ext{4, 8, 12};
inline void choose_extents(bool uneven) {
  ext = uneven ? std::array<std::int64_t, 3>{7, 13, 2} : std::array<std::int64_t, 3>{4, 8, 12};
}

template <class Exec, class M, class Layouts, class Op>
void check_all_layouts(const M& g, Layouts layouts, Op op) {
  const auto want = op.template operator()<mt::layout<M>, Exec>(g);
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    const auto got = op.template operator()<L, Exec>(g);
    REQUIRE(max_rel_error(got, want) <= tol);
  });
}

}  // namespace tst::op_family

// The test cases of one family of ops, RUN<Exec>(mesh, layouts): every layout of mesh [P] and the
// cover of [2x2]'s (grid_layouts) on the default space, and one split layout on every space (the
// same kernels per space).
#define MESHTENSOR_OP_FAMILY_SWEEP(FAMILY, RUN)                                                                  \
  TEMPLATE_TEST_CASE(FAMILY " are layout-transparent", "[equivalence]", Kokkos::DefaultExecutionSpace) {        \
    choose_extents(GENERATE(false, true));                                                                      \
    INFO("extents " << ext[0] << " x " << ext[1] << " x " << ext[2]);                                           \
    SECTION("mesh [P]") { RUN<TestType>(world_line(), line_layouts<line, i_, j_, k_>{}); }                      \
    SECTION("mesh [2x2]") { RUN<TestType>(world_grid(), grid_layouts<i_, j_, k_>{}); }                          \
  }                                                                                                             \
  TEMPLATE_TEST_CASE(FAMILY " agree on every backend", "[equivalence]", MESHTENSOR_TEST_SPACES) {               \
    choose_extents(GENERATE(false, true));                                                                      \
    RUN<TestType>(world_grid(), list<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>>{});                \
  }
