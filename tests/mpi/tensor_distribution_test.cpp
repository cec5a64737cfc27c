// A tensor distributed over a mesh, at 1, 2 and 4 ranks: gather(scatter(x)) == x under every layout
// of a 3-D tensor on meshes [P] and [2x2]; random tensors equal across layouts, and statistically
// sane; generate() of the global multi-index the same under every layout; slices tile the tensor;
// uneven extents split in balanced parts; describe(); errors raised on every rank.
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <algorithm>
#include <numeric>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
using Catch::Matchers::ContainsSubstring;

namespace {
// generate's function: distinct digits per index, so that a transposed or shifted index shows.
struct digits_of_index {
  KOKKOS_INLINE_FUNCTION double operator()(const Kokkos::Array<std::int64_t, 3>& i) const {
    return double(i[0] * 1000 + i[1] * 100 + i[2]) + 0.5;
  }
};

template <class Exec, class M, class Layouts>
void check_roundtrip_and_random(const M& g, Layouts layouts) {
  const std::array<std::int64_t, 3> ext{4, 8, 12};
  std::vector<double> host(4 * 8 * 12);
  std::iota(host.begin(), host.end(), 0.5);
  std::vector<double> digits;
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 8; ++j)
      for (std::int64_t k = 0; k < 12; ++k) digits.push_back(double(i * 1000 + j * 100 + k) + 0.5);
  using ref_t = mt::basic_tensor<double, mt::layout<M>, Exec, i_, j_, k_>;
  const auto ref_normal = mt::gather_all(mt::random_normal<ref_t>(g, ext, 42));
  const auto ref_uniform = mt::gather_all(mt::random_uniform<ref_t>(g, ext, 7, -1.0, 1.0));
  for_each_type(layouts, [&]<class L>() {
    using T = mt::basic_tensor<double, L, Exec, i_, j_, k_>;
    INFO(layout_name<L>());
    REQUIRE(mt::gather_all(mt::scatter<T>(g, ext, host)) == host);
    REQUIRE(mt::gather_all(mt::from_host<T>(g, ext, host)) == host);
    const auto on_root = mt::gather(mt::scatter<T>(g, ext, host));
    if (g.rank() == 0)
      REQUIRE(on_root == host);
    else
      REQUIRE(on_root.empty());
    REQUIRE(mt::gather_all(mt::random_normal<T>(g, ext, 42)) == ref_normal);
    REQUIRE(mt::gather_all(mt::random_uniform<T>(g, ext, 7, -1.0, 1.0)) == ref_uniform);
    const auto io = mt::gather_all(mt::iota<T>(g, ext, 0.5, 1.0));
    REQUIRE(io == host);
    REQUIRE(mt::gather_all(mt::generate<T>(g, ext, digits_of_index{})) == digits);
    // item(): a rank-0 result (allreduced over every split axis) on every processor; the elements
    // are halves, so any order of summation is exact.
    REQUIRE(mt::item(mt::reduce_sum<i_, j_, k_>(mt::from_host<T>(g, ext, host))) ==
            std::accumulate(host.begin(), host.end(), 0.0));
  });
}
}  // namespace

TEMPLATE_TEST_CASE("gather(scatter(x)) == x and random tensors are layout-independent", "[tensor_distribution]",
                   MESHTENSOR_TEST_SPACES) {
  SECTION("mesh [P]") { check_roundtrip_and_random<TestType>(world_line(), line_layouts<line, i_, j_, k_>{}); }
  SECTION("mesh [2x2] (or [P x 1])") { check_roundtrip_and_random<TestType>(world_grid(), grid_layouts<i_, j_, k_>{}); }
}

TEST_CASE("random tensors are statistically sane", "[tensor_distribution]") {
  auto g = world_line();
  using T = mt::tensor<double, mt::layout<line, mt::split<i_, x_>>, i_>;
  const auto v = mt::gather_all(mt::random_normal<T>(g, {40000}, 3, 1.0, 2.0));
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double var = 0;
  for (double e : v) var += (e - mean) * (e - mean);
  var /= v.size();
  REQUIRE(std::abs(mean - 1.0) < 0.05);
  REQUIRE(std::abs(std::sqrt(var) - 2.0) < 0.05);
  const auto a = mt::gather_all(mt::random_normal<T>(g, {64}, 3));
  const auto b = mt::gather_all(mt::random_normal<T>(g, {64}, 4));
  REQUIRE(a != b);
}

TEST_CASE("slices tile the tensor: offsets and extents per processor", "[tensor_distribution]") {
  auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_, c_>, mt::split<k_, c_>>;
  using T = mt::tensor<float, L, i_, j_>;
  const int p = g.nprocs();
  T t(g, {8 * p, 3});
  std::int64_t covered = 0;
  for (int r = 0; r < p; ++r) {
    const auto b = t.slice_of(r);
    REQUIRE(b.extent[0] == 8);
    REQUIRE(b.extent[1] == 3);
    // Row-major over (r, c): the processor at (rr, cc) holds part rr * size(c) + cc.
    const auto coords = g.communicator().coords_of(r);
    REQUIRE(b.offset[0] == 8 * (coords[0] * g.size<c_>() + coords[1]));
    covered += b.extent[0];
  }
  REQUIRE(covered == 8 * p);
  const auto text = mt::describe(t);
  REQUIRE_THAT(text, ContainsSubstring("i -> r(") && ContainsSubstring("j -> replicated") &&
                         ContainsSubstring("[0, 8)"));
}

TEST_CASE("an extent that does not divide is split in balanced parts; require_even refuses it on every rank", "[tensor_distribution]") {
  auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_, c_>>;
  using T = mt::tensor<float, L, i_, j_>;
  const int p = g.nprocs();
  // 4p + 1 rows over p parts: the first part holds 5, the others 4.
  const std::int64_t n = 4 * p + 1;
  std::vector<float> full(static_cast<std::size_t>(n * 3));
  for (std::size_t e = 0; e < full.size(); ++e) full[e] = static_cast<float>(e);
  auto t = mt::from_host<T>(g, {n, 3}, full);
  const auto coords = g.communicator().coords();
  const std::int64_t part = coords[0] * g.size<c_>() + coords[1];
  REQUIRE(t.local_extent<i_>() == (part == 0 ? 5 : 4));
  REQUIRE(t.offsets()[0] == (part == 0 ? 0 : 4 * part + 1));
  REQUIRE(mt::gather_all(t) == full);
  // More parts than rows: 2 rows cut over r, then each part over c (nested), so some processors
  // hold nothing; the tensor still gathers back.
  auto small = mt::iota<T>(g, {2, 3});
  const std::int64_t R = g.size<r_>(), C = g.size<c_>();
  const std::int64_t over_r = 2 / R + (coords[0] < 2 % R ? 1 : 0);
  const int right = small.local_extent<i_>() == over_r / C + (coords[1] < over_r % C ? 1 : 0) ? 1 : 0;
  int everywhere = 0;  // agreed: a REQUIRE failing on some ranks only would hang the others
  MPI_Allreduce(&right, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  REQUIRE(everywhere == 1);
  REQUIRE(mt::gather_all(small) == std::vector<float>{0, 1, 2, 3, 4, 5});
  if (p > 1) REQUIRE_THAT(mt::describe(t), ContainsSubstring("uneven: 5 or 4 per part"));
  if (p == 1) {
    REQUIRE_NOTHROW(mt::require_even(t));
    return;
  }
  // Every rank must throw; an allreduce afterwards proves none is left behind.
  int threw = 0;
  try {
    mt::require_even(t);
  } catch (const mt::shape_error& e) {
    threw = 1;
    REQUIRE_THAT(std::string(e.what()), ContainsSubstring("dim 'i'") && ContainsSubstring("extent " + std::to_string(n)) &&
                                            ContainsSubstring("r(") && ContainsSubstring("c("));
  }
  int all = 0;
  MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  REQUIRE(all == 1);
}

TEST_CASE("describe() of a tensor on a [16 x 32] mesh needs no processes", "[tensor_distribution]") {
  using big = mt::mesh<r_, c_>;
  using L = mt::layout<big, mt::split<i_, r_>, mt::split<j_, c_>>;
  using T = mt::tensor<float, L, i_, j_>;
  const auto text = mt::describe<T>(big::shape_of({16, 32}), {50257, 64});
  // 50257 = 16 * 3141 + 1: row 0 holds [0, 3142), row 15 [47116, 50257); 64 / 32 = 2 columns each.
  REQUIRE_THAT(text, ContainsSubstring("on mesh [r=16, c=32]") && ContainsSubstring("[47116, 50257)") &&
                         ContainsSubstring("[0, 3142)") && ContainsSubstring("[62, 64)") &&
                         ContainsSubstring("uneven: 3142 or 3141 per part"));
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 3 + 512);
}
