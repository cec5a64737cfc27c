#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("a mesh whose sizes do not multiply to the world size is a mesh_error naming them", "[errors]") {
  const int p = world_size();
  REQUIRE_THROWS_MATCHES(grid(MPI_COMM_WORLD, {p + 1, 2}), mt::mesh_error,
                         Catch::Matchers::MessageMatches(ContainsSubstring("r=" + std::to_string(p + 1)) &&
                                                         ContainsSubstring("c=2") &&
                                                         ContainsSubstring("needs " + std::to_string(2 * (p + 1)))));
  REQUIRE_THROWS_AS(grid(MPI_COMM_WORLD, {0, p}), mt::error);
}

TEST_CASE("operands that disagree on a dim's extent are a shape_error naming the dim", "[errors]") {
  auto g = world_line();
  using L = mt::layout<line>;
  auto a = mt::zeros<mt::tensor<float, L, i_, j_>>(g, {3, 4});
  auto b = mt::zeros<mt::tensor<float, L, j_, k_>>(g, {5, 2});
  REQUIRE_THROWS_MATCHES(a + b, mt::shape_error,
                         Catch::Matchers::MessageMatches(ContainsSubstring("dim 'j'") && ContainsSubstring("4") &&
                                                         ContainsSubstring("5")));
  REQUIRE_THROWS_MATCHES((mt::einsum<i_, k_>(a, b)), mt::shape_error,
                         Catch::Matchers::MessageMatches(ContainsSubstring("einsum") && ContainsSubstring("dim 'j'")));
}

TEST_CASE("from_host with the wrong number of elements is a shape_error naming both sizes", "[errors]") {
  auto g = world_line();
  using T = mt::tensor<float, mt::layout<line>, i_, j_>;
  std::vector<float> host(11);
  REQUIRE_THROWS_MATCHES(mt::from_host<T>(g, {3, 4}, host), mt::shape_error,
                         Catch::Matchers::MessageMatches(ContainsSubstring("11") && ContainsSubstring("12")));
}
