// Layouts as values, in one process and without MPI: this file includes only layout/ (and geometry/
// for the placement a layout gives), and fails to compile if either pulled in MPI or Kokkos. The
// mesh type here is never defined (runtime/mesh.hpp is not included): a layout needs its axes only.
#include <catch2/catch_test_macros.hpp>
#include <meshtensor/geometry/placement.hpp>
#include <meshtensor/layout/candidates.hpp>
#include <meshtensor/layout/layout.hpp>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#if defined(MPI_VERSION) || defined(OMPI_MPI_H)
#error "layout/ includes MPI: the layouts must stay values (layout/mesh_axes.hpp)"
#endif
#if defined(KOKKOS_VERSION)
#error "layout/ includes Kokkos: the layouts must stay values"
#endif

namespace mt = meshtensor;

namespace {
struct batch : mt::dim<"batch"> {};
struct hidden : mt::dim<"hidden"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;  // declared (layout/mesh_axes.hpp), not defined here

using data_parallel = mt::layout<grid, mt::split<batch, rows>>;
using two_axes = mt::layout<grid, mt::split<batch, cols, rows>>;
}  // namespace

TEST_CASE("a mesh type's axes are known without the running mesh", "[layout]") {
  STATIC_REQUIRE(std::is_same_v<mt::mesh_axes_t<grid>, mt::type_list<rows, cols>>);
  STATIC_REQUIRE(mt::is_mesh_v<grid>);
  STATIC_REQUIRE(!mt::is_mesh_v<rows>);
  STATIC_REQUIRE(mt::Layout<data_parallel>);
}

TEST_CASE("a layout's splits name the mesh axes in the order its rule gives", "[layout]") {
  constexpr mt::dim_split b = data_parallel::split_of<batch>();
  STATIC_REQUIRE(b.count == 1);
  STATIC_REQUIRE(b.axes[0] == 0);
  STATIC_REQUIRE(data_parallel::split_of<hidden>().count == 0);  // no rule: replicated

  constexpr mt::dim_split both = two_axes::split_of<batch>();
  STATIC_REQUIRE(both.count == 2);
  STATIC_REQUIRE(both.axes[0] == 1);  // cols first, as the rule says
  STATIC_REQUIRE(both.axes[1] == 0);
  STATIC_REQUIRE(both.mask() == 3u);
  STATIC_REQUIRE(!both.in_mesh_order());
  STATIC_REQUIRE(mt::replicated<grid>::split_of<batch>().count == 0);
}

TEST_CASE("the placement of a layout tiles the tensor: every element has one owner", "[layout]") {
  // batch over (cols, rows) on a 2 x 3 mesh: 6 parts of an extent that does not divide (10).
  const std::array<mt::dim_split, 2> splits{two_axes::split_of<batch>(), two_axes::split_of<hidden>()};
  const std::vector<int> sizes{2, 3};
  const mt::placement<2> p(splits, std::span<const int>(sizes), {10, 4});
  REQUIRE(p.parts(0) == 6);
  REQUIRE(p.parts(1) == 1);
  std::int64_t covered = 0;
  for (std::int64_t rank = 0; rank < p.nprocs(); ++rank) covered += p.box_of(rank).size();
  REQUIRE(covered == 10 * 4);
  for (std::int64_t i = 0; i < 10; ++i) REQUIRE(p.owners({i, 0}).size() == 1);
}

TEST_CASE("the candidate layouts of a mesh type are enumerated without processes", "[layout]") {
  using all = mt::candidate_layouts<grid, batch, hidden>;
  STATIC_REQUIRE(all::size == 9);  // (2 dims + none)^2 axes
  std::set<std::string> names;
  mt::for_each_layout(all{}, [&]<class L>() { names.insert(mt::layout_string<L>()); });
  REQUIRE(names.size() == 9);
  REQUIRE(names.count("layout<mesh<rows, cols>, split<batch, rows>, split<hidden, cols>>") == 1);
  REQUIRE(names.count("layout<mesh<rows, cols>>") == 1);
}
