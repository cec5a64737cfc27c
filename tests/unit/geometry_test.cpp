// The geometry layer's laws, in one process and without MPI (the headers include none): the split
// algebra that relayout, reshape and the sum-scattering gradients read (analyze_relayout,
// added_axes, scatters_over, kept_splits), checked against placement's boxes element by element;
// the runs that host I/O, checkpoints and relayout's packing copy; mesh coordinates.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/geometry/box.hpp>
#include <meshtensor/geometry/exchange.hpp>
#include <meshtensor/geometry/placement.hpp>
#include <meshtensor/geometry/split.hpp>
#include <meshtensor/geometry/window.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <vector>

namespace mt = meshtensor;

namespace {

mt::dim_split over(const std::vector<int>& axes) { return mt::dim_split::over(axes); }

// Every layout of a rank-2 tensor on a mesh of `naxes` axes: each axis splits at most one dim, in
// any order (a layout rule names an axis once).
std::vector<std::array<mt::dim_split, 2>> layouts(int naxes) {
  // Each axis goes to dim 0, dim 1 or none; then every order of each dim's axes.
  std::vector<std::array<mt::dim_split, 2>> out;
  int combos = 1;
  for (int a = 0; a < naxes; ++a) combos *= 3;
  for (int c = 0; c < combos; ++c) {
    std::array<std::vector<int>, 2> axes;
    for (int a = 0, rest = c; a < naxes; ++a, rest /= 3)
      if (rest % 3 < 2) axes[rest % 3].push_back(a);
    std::sort(axes[0].begin(), axes[0].end());
    do {
      std::sort(axes[1].begin(), axes[1].end());
      do out.push_back({over(axes[0]), over(axes[1])});
      while (std::next_permutation(axes[1].begin(), axes[1].end()));
    } while (std::next_permutation(axes[0].begin(), axes[0].end()));
  }
  return out;
}

}  // namespace

TEST_CASE("a relayout step's collective brings every processor what its new box needs", "[geometry][split]") {
  // On a 2x3x2 mesh, for every pair of rank-2 layouts and both even and uneven extents: where the
  // step says share, the boxes are equal; local, the new box lies inside the old one; allgather or
  // alltoall over axes A, every element of the new box is held under the old layout by a processor
  // that differs from this one only on A (the collective's group). And the group is no larger than
  // needed: every axis of A is one some dim stops being split over.
  const mt::mesh_shape mesh({"a", "b", "c"}, {2, 3, 2});
  const auto all = layouts(3);
  REQUIRE(all.size() == 49);  // sum over (i, j) of 3! / (3 - i - j)!: ordered axes for each dim
  int counted[4] = {0, 0, 0, 0};
  for (const std::array<std::int64_t, 2> ext : {std::array<std::int64_t, 2>{12, 6}, {7, 5}}) {
    for (const auto& from : all)
      for (const auto& to : all) {
        const auto step = mt::analyze_relayout<2>(from, to);
        ++counted[static_cast<int>(step.kind)];
        const mt::placement<2> old_p(from, mesh, ext), new_p(to, mesh, ext);
        for (std::int64_t r = 0; r < mesh.nprocs(); ++r) {
          const auto nb = new_p.box_of(r), ob = old_p.box_of(r);
          if (step.kind == mt::relayout_kind::share) REQUIRE(nb == ob);
          if (step.kind == mt::relayout_kind::local) REQUIRE(mt::intersect(nb, ob) == nb);
          if (step.kind == mt::relayout_kind::allgather || step.kind == mt::relayout_kind::alltoall) {
            REQUIRE(step.axes != 0);
            std::int64_t covered = 0;
            const auto me = mesh.coords_of(r);
            for (int q = 0; q < mesh.size_over(step.axes); ++q)
              covered += mt::intersect(nb, old_p.box_at(mesh.peer_coords(me, step.axes, q))).size();
            REQUIRE(covered == nb.size());
          }
        }
        for (int a = 0; a < 3; ++a)
          if (step.axes.contains(a)) {
            bool dropped = false;
            for (int d = 0; d < 2; ++d)
              for (int k = mt::common_prefix(from[d], to[d]); k < from[d].count; ++k) dropped |= from[d].axes[k] == a;
            REQUIRE(dropped);
          }
      }
  }
  // Every kind occurs in the sweep, so each law above was exercised.
  for (int k = 0; k < 4; ++k) CHECK(counted[k] > 0);
}

TEST_CASE("extending splits is local; the way back gathers exactly the added axes", "[geometry][split]") {
  const auto all = layouts(3);
  int extensions = 0;
  for (const auto& from : all)
    for (const auto& to : all) {
      bool extends = true;
      for (int d = 0; d < 2; ++d) extends = extends && mt::common_prefix(from[d], to[d]) == from[d].count;
      if (!extends) continue;
      ++extensions;
      const mt::axis_set added = mt::added_axes<2>(from, to);
      const auto there = mt::analyze_relayout<2>(from, to), back = mt::analyze_relayout<2>(to, from);
      if (added.empty()) {
        REQUIRE(there.kind == mt::relayout_kind::share);
        REQUIRE(back.kind == mt::relayout_kind::share);
      } else {
        REQUIRE(there.kind == mt::relayout_kind::local);
        REQUIRE(back == mt::relayout_step{mt::relayout_kind::allgather, added});
      }
      // A sum of partials over exactly the added axes scatters in one reduce_scatter; over any
      // other set of axes it does not.
      for (unsigned axes = 0; axes < 8; ++axes) REQUIRE(mt::scatters_over<2>(from, to, axes) == (axes == added));
      if (!added.empty()) REQUIRE_FALSE(mt::scatters_over<2>(to, from, added));
    }
  REQUIRE(extensions > 60);
}

TEST_CASE("a split moving between dims is one alltoall over its axis", "[geometry][split]") {
  const std::array<mt::dim_split, 2> rows{over({0}), over({})}, cols{over({}), over({0})};
  CHECK(mt::analyze_relayout<2>(rows, cols) == mt::relayout_step{mt::relayout_kind::alltoall, 1u});
  // Dropping an axis nobody takes up is an allgather, even when another dim gains an axis.
  const std::array<mt::dim_split, 2> ab{over({0}), over({})}, cb{over({}), over({1})};
  CHECK(mt::analyze_relayout<2>(ab, cb) == mt::relayout_step{mt::relayout_kind::allgather, 1u});
  // Reordering a dim's axes keeps the prefix only: the rest is gathered.
  const std::array<mt::dim_split, 1> xy{over({0, 1})}, yx{over({1, 0})};
  CHECK(mt::analyze_relayout<1>(xy, yx) == mt::relayout_step{mt::relayout_kind::allgather, 3u});
  CHECK(mt::common_prefix(xy[0], yx[0]) == 0);
  CHECK(mt::common_prefix(xy[0], xy[0]) == 2);
  CHECK_THROWS_WITH(mt::dim_split::over({0, 1, 2, 3, 4, 5, 6, 7, 8}),
                    Catch::Matchers::ContainsSubstring("a dim split over 9 axes; meshes have at most 8"));
}

TEST_CASE("kept_splits replicates the dropped dims and keeps the rest", "[geometry][split]") {
  const std::array<mt::dim_split, 3> s{over({0}), over({1, 2}), over({})};
  const auto kept = mt::kept_splits<3>(s, {false, true, false});
  CHECK(kept[0] == s[0]);
  CHECK(kept[1] == mt::dim_split{});
  CHECK(kept[2] == s[2]);
  CHECK(s[1].mask() == 6u);
  CHECK(kept[1].mask() == 0u);
}

TEST_CASE("a split's parts by sub-rank: identity in mesh order, the rule's order otherwise", "[geometry][split]") {
  const mt::mesh_shape mesh({"x", "y"}, {2, 3});
  const std::vector<int> me{1, 2};
  const auto in_order = mt::parts_by_subrank(over({0, 1}), mesh, me);
  CHECK(in_order == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(over({0, 1}).in_mesh_order());
  CHECK_FALSE(over({1, 0}).in_mesh_order());
  // Rule (y, x): part = y * 2 + x, sub-ranks number x * 3 + y.
  const auto reversed = mt::parts_by_subrank(over({1, 0}), mesh, me);
  CHECK(reversed == std::vector<int>{0, 2, 4, 1, 3, 5});
  // The part a processor holds is the one placement gives it.
  for (std::int64_t r = 0; r < mesh.nprocs(); ++r) {
    const auto c = mesh.coords_of(r);
    const mt::placement<1> p({over({1, 0})}, mesh, {12});
    CHECK(over({1, 0}).part_at(mesh.sizes(), c) == p.part_at(0, c));
  }
}

TEST_CASE("coordinates and ranks are inverse, and placement's boxes and owners follow them", "[geometry][mesh]") {
  const mt::mesh_shape mesh({"a", "b", "c"}, {2, 3, 2});
  for (std::int64_t r = 0; r < mesh.nprocs(); ++r) REQUIRE(mesh.rank_of(mesh.coords_of(r)) == r);
  const std::array<std::int64_t, 2> ext{7, 5};
  for (const auto& splits : layouts(3)) {
    const mt::placement<2> p(splits, mesh, ext);
    for (std::int64_t r = 0; r < mesh.nprocs(); ++r) REQUIRE(p.box_of(r) == p.box_at(mesh.coords_of(r)));
    for (std::int64_t i = 0; i < ext[0]; ++i)
      for (std::int64_t j = 0; j < ext[1]; ++j) {
        std::vector<std::int64_t> holders;
        for (std::int64_t r = 0; r < mesh.nprocs(); ++r)
          if (p.box_of(r).contains({i, j})) holders.push_back(r);
        REQUIRE(p.owners({i, j}) == holders);
      }
  }
}

namespace {

// The global coordinates of element `at` of a row-major buffer holding box b.
template <std::size_t R>
std::array<std::int64_t, R> coords_in(const mt::box<R>& b, std::int64_t at) {
  std::array<std::int64_t, R> c{};
  for (std::size_t i = R; i-- > 0;) {
    c[i] = b.offset[i] + at % b.extent[i];
    at /= b.extent[i];
  }
  return c;
}

// Every box of a rank-3 array of extents ext with offsets and extents from a small grid.
std::vector<mt::box<3>> boxes_in(const std::array<std::int64_t, 3>& ext) {
  std::vector<mt::box<3>> out;
  for (std::int64_t o0 = 0; o0 < ext[0]; o0 += 2)
    for (std::int64_t e0 = 1; o0 + e0 <= ext[0]; e0 += 2)
      for (std::int64_t o1 : {0, 1})
        for (std::int64_t e1 = 0; o1 + e1 <= ext[1]; ++e1)
          for (std::int64_t o2 : {0, 2})
            for (std::int64_t e2 = 1; o2 + e2 <= ext[2]; ++e2) out.push_back({{o0, o1, o2}, {e0, e1, e2}});
  return out;
}

}  // namespace

TEST_CASE("runs_of covers a box once, in its row-major order, each run contiguous in the array", "[geometry][box]") {
  const std::array<std::int64_t, 3> ext{5, 3, 4};
  const mt::box<3> whole{{0, 0, 0}, ext};
  int merged = 0;
  for (const auto& b : boxes_in(ext)) {
    const auto runs = mt::runs_of(b, ext);
    REQUIRE(runs.count * runs.length == b.size());
    for (std::int64_t k = 0; k < runs.count; ++k) {
      const auto [g, l] = runs.at(k);
      REQUIRE(l == k * runs.length);  // the box's own order, back to back
      for (std::int64_t e = 0; e < runs.length; ++e) REQUIRE(coords_in(whole, g + e) == coords_in(b, l + e));
    }
    merged += runs.length > b.extent[2];
  }
  CHECK(merged > 0);  // some boxes span trailing dims whole, and their runs merge them
  // The whole array is one run; a box one element wide is runs of one.
  CHECK(mt::runs_of(whole, ext).count == 1);
  CHECK(mt::runs_of(mt::box<3>{{1, 1, 1}, {2, 2, 1}}, ext).length == 1);
}

TEST_CASE("runs_between pairs the same element in both buffers, whatever boxes they hold", "[geometry][box]") {
  const std::array<std::int64_t, 3> ext{5, 3, 4};
  const auto all = boxes_in(ext);
  for (std::size_t i = 0; i < all.size(); i += 7)
    for (std::size_t j = 0; j < all.size(); j += 5) {
      const auto& a = all[i];
      const auto& b = all[j];
      const auto region = mt::intersect(a, b);
      const auto runs = mt::runs_between(region, a, b);
      REQUIRE(runs.count * runs.length == region.size());
      std::set<std::array<std::int64_t, 3>> seen;
      for (std::int64_t k = 0; k < runs.count; ++k) {
        const auto [at_a, at_b] = runs.at(k);
        for (std::int64_t e = 0; e < runs.length; ++e) {
          const auto c = coords_in(a, at_a + e);
          REQUIRE(c == coords_in(b, at_b + e));
          REQUIRE(region.contains(c));
          seen.insert(c);
        }
      }
      REQUIRE(static_cast<std::int64_t>(seen.size()) == region.size());
      // Where the region is contiguous in both buffers, it is one run.
      if (region.size() > 0 && mt::contiguous_in(a, region) && mt::contiguous_in(b, region))
        REQUIRE(runs.count == 1);
    }
}

TEST_CASE("runs of rank 0, of empty boxes, and past the rank limit", "[geometry][box]") {
  const auto scalar = mt::runs_of(mt::box<0>{}, std::array<std::int64_t, 0>{});
  CHECK(scalar.count == 1);
  CHECK(scalar.length == 1);
  CHECK(scalar.at(0) == std::array<std::int64_t, 2>{0, 0});
  CHECK(mt::runs_of(mt::box<2>{{1, 0}, {0, 3}}, std::array<std::int64_t, 2>{4, 3}).count == 0);
  const std::vector<std::int64_t> nine(9, 1), zeros(9, 0);
  CHECK_THROWS_WITH(mt::runs_of(zeros, nine, nine),
                    Catch::Matchers::ContainsSubstring("a box of rank 9") && Catch::Matchers::ContainsSubstring("at most 8"));
}

TEST_CASE("a window's halo: neighbours send exactly what the next part reads, and the buffer covers it", "[geometry][window]") {
  // Every processor of a line of 1-5 parts, for windows of 1-4 taps, strides 1-3, dilations 1-2,
  // both paddings and extents 5-23: where the schedule takes the neighbours path, what part q sends
  // right is what part q + 1 receives from the left (the same count, starting where q + 1's windows
  // start reading, inside q's own part), and alike to the left; each processor's buffer covers the
  // input its windows read. Every processor takes the same path, and a dim split over two axes
  // always gathers.
  int neighbour_cases = 0, gather_cases = 0;
  for (int p = 1; p <= 5; ++p) {
    const mt::mesh_shape line({"x"}, {p});
    const auto split = mt::dim_split::over({0});
    for (std::int64_t extent = 5; extent <= 23; extent += 3)
      for (std::int64_t size = 1; size <= 4; ++size)
        for (std::int64_t stride = 1; stride <= 3; ++stride)
          for (std::int64_t dilation = 1; dilation <= 2; ++dilation)
            for (const auto pad : {mt::padding::valid, mt::padding::same}) {
              if (pad == mt::padding::valid && (size - 1) * dilation + 1 > extent) continue;
              const auto geo = mt::geometry_of("test", "x", extent, {size, stride, dilation, pad});
              std::vector<mt::halo_dim> h;
              for (int q = 0; q < p; ++q) h.push_back(mt::schedule_halo(0, split, geo, line, std::vector<int>{q}));
              for (int q = 0; q < p; ++q) {
                INFO("p " << p << " extent " << extent << " size " << size << " stride " << stride << " dilation "
                          << dilation << " part " << q);
                REQUIRE(h[q].path == h[0].path);
                if (h[q].need_hi > h[q].need_lo) {
                  REQUIRE(h[q].buf_lo <= h[q].need_lo);
                  REQUIRE(h[q].need_hi <= h[q].buf_hi);
                }
                if (h[q].path != mt::halo_path::neighbours) continue;
                REQUIRE(h[q].buf_lo >= h[q].own_lo - h[q].from_left);
                REQUIRE(h[q].buf_hi <= h[q].own_hi + h[q].from_right);
                if (q + 1 < p) {
                  REQUIRE(h[q].to_right == h[q + 1].from_left);
                  REQUIRE(h[q + 1].to_left == h[q].from_right);
                  if (h[q].to_right > 0) {
                    REQUIRE(h[q].to_right_at == h[q + 1].need_lo);
                    REQUIRE(h[q].own_lo <= h[q].to_right_at);
                    REQUIRE(h[q].to_right_at + h[q].to_right <= h[q].own_hi);
                  }
                  if (h[q + 1].to_left > 0) {
                    REQUIRE(h[q + 1].own_lo <= h[q + 1].to_left_at);
                    REQUIRE(h[q + 1].to_left_at + h[q + 1].to_left <= h[q + 1].own_hi);
                    REQUIRE(h[q + 1].to_left_at + h[q + 1].to_left == h[q].need_hi);
                  }
                }
              }
              neighbour_cases += h[0].path == mt::halo_path::neighbours;
              gather_cases += h[0].path == mt::halo_path::gather;
            }
  }
  CHECK(neighbour_cases > 100);
  CHECK(gather_cases > 10);  // windows reaching past a small neighbour's part
  const mt::mesh_shape grid({"a", "b"}, {2, 2});
  const auto geo = mt::geometry_of("test", "x", 16, {3, 1, 1, mt::padding::same});
  CHECK(mt::schedule_halo(0, mt::dim_split::over({0, 1}), geo, grid, std::vector<int>{1, 0}).path ==
        mt::halo_path::gather);
  CHECK(mt::schedule_halo(0, mt::dim_split{}, geo, grid, std::vector<int>{1, 0}).path ==
        mt::halo_path::local);
}

TEST_CASE("a malformed or oversized window names the op, the dim and the numbers", "[geometry][window]") {
  CHECK_THROWS_WITH(mt::geometry_of("conv", "h", 8, {0, 1, 1, mt::padding::valid}),
                    Catch::Matchers::ContainsSubstring("conv: the window along dim 'h' needs size, stride and dilation of at least 1 (got size 0"));
  CHECK_THROWS_WITH(mt::geometry_of("unfold", "w", 4, {3, 1, 2, mt::padding::valid}),
                    Catch::Matchers::ContainsSubstring("unfold: a window spanning 5 elements (size 3, dilation 2) does not fit dim 'w' of extent 4"));
  // same padding: ceil(extent / stride) positions, the odd padding element at the end.
  const auto g = mt::geometry_of("unfold", "w", 10, {3, 3, 1, mt::padding::same});
  CHECK(g.out == 4);
  CHECK(g.pad_lo == 1);  // (4 - 1) * 3 + 3 - 10 = 2 padding elements, one before
  CHECK(g.reads(0, 4) == std::pair<std::int64_t, std::int64_t>{0, 10});
}

TEST_CASE("an exchange's blocks lie back to back in peer order, as MPI's counts and displacements", "[geometry][exchange]") {
  const std::vector<std::int64_t> sizes{3, 0, 5, 2};
  const mt::exchange_blocks b(sizes);
  REQUIRE(b.peers() == 4);
  CHECK(b.counts == std::vector<int>{3, 0, 5, 2});
  CHECK(b.displs == std::vector<int>{0, 3, 3, 8});
  CHECK(b.total == 10);
  CHECK(mt::exchange_blocks(std::vector<std::int64_t>{}).total == 0);
  // MPI's counts are ints: past INT32_MAX the size is named, not wrapped.
  const std::int64_t big = std::int64_t{1} << 31;
  CHECK_THROWS_WITH(mt::exchange_blocks(std::vector<std::int64_t>{big}),
                    Catch::Matchers::ContainsSubstring("2147483648 elements exceeds MPI's int count"));
}

TEST_CASE("every processor's box under a placement: the exchange tiles the tensor once", "[geometry][exchange]") {
  const mt::mesh_shape mesh({"a", "b"}, {2, 3});
  for (const auto& splits : layouts(2)) {
    const mt::placement<2> p(splits, mesh, {7, 5});  // uneven along both dims
    const auto all = mt::all_boxes(p);
    REQUIRE(all.peers() == 6);
    // Replicas hold the same box: the total counts each element once per replica.
    std::int64_t replicas = 6;
    for (const auto& s : splits) replicas /= s.parts(std::span<const int>(mesh.sizes()));
    CHECK(all.total == 7 * 5 * replicas);
    for (std::size_t r = 0; r < all.peers(); ++r) {
      CHECK(all.counts[r] == all.boxes[r].size());
      if (r > 0) CHECK(all.displs[r] == all.displs[r - 1] + all.counts[r - 1]);
    }
  }
}

TEST_CASE("an exchange is in place in a region where each block is its own contiguous run there", "[geometry][exchange]") {
  const mt::mesh_shape line({"x"}, {3});
  const mt::box<2> whole{{0, 0}, {7, 4}};
  // Rows split over x: the peers' boxes, back to back, are the whole array's row-major order.
  const mt::placement<2> rows({over({0}), mt::dim_split{}}, line, {7, 4});
  const mt::exchange<2> by_rows(mt::peer_boxes(rows, line, std::vector<int>{1}, mt::axis_set(1u)));
  CHECK(by_rows.in_place_in(whole));
  CHECK(by_rows.packs_as(whole));
  // Columns split: each block is strided in the whole array, so it must be packed.
  const mt::placement<2> cols({mt::dim_split{}, over({0})}, line, {7, 4});
  const mt::exchange<2> by_cols(mt::peer_boxes(cols, line, std::vector<int>{0}, mt::axis_set(1u)));
  CHECK(!by_cols.in_place_in(whole));
  CHECK(!by_cols.packs_as(whole));
  // Blocks in place but not covering the region: in place, yet not the region's buffer itself.
  const mt::exchange<2> first_two(std::vector<mt::box<2>>{by_rows.boxes[0], by_rows.boxes[1]});
  CHECK(first_two.in_place_in(whole));
  CHECK(!first_two.packs_as(whole));
}

TEST_CASE("a shift's path: local unsplit, neighbours on one axis within the smallest part, else gathered", "[geometry][window]") {
  using mt::halo_path;
  CHECK(mt::shift_halo_path(mt::dim_split{}, 5, 100) == halo_path::local);
  for (std::int64_t reach : {-3, -1, 0, 1, 3}) CHECK(mt::shift_halo_path(over({0}), 3, reach) == halo_path::neighbours);
  CHECK(mt::shift_halo_path(over({0}), 3, 4) == halo_path::gather);
  CHECK(mt::shift_halo_path(over({0}), 3, -4) == halo_path::gather);
  CHECK(mt::shift_halo_path(over({0, 1}), 100, 1) == halo_path::gather);
  // The neighbours path is taken exactly when what shifts into every part (wrapping around, as
  // boundary::wrap does) comes from the part before it alone: that part holds at least |reach|.
  // 7 over 4 parts is 2, 2, 2, 1: the last part, the smallest, decides for the first.
  const mt::mesh_shape line({"x"}, {4});
  for (std::int64_t extent : {4, 7, 9, 13})
    for (std::int64_t reach = 1; reach <= extent; ++reach) {
      const mt::placement<1> p({over({0})}, line, {extent});
      const bool neighbours = mt::shift_halo_path(over({0}), p.min_part_extent(0), reach) == halo_path::neighbours;
      bool adjacent = true;
      for (std::int64_t q = 0; q < p.parts(0); ++q)
        adjacent = adjacent && p.part_extent(0, (q + p.parts(0) - 1) % p.parts(0)) >= reach;
      CHECK(neighbours == adjacent);
    }
}
