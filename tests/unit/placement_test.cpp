// The placement algebra's laws, in one process and without MPI: this file includes only the
// placement header, which needs no communicator.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/geometry/placement.hpp>

#include <array>
#include <cstdint>
#include <vector>

namespace mt = meshtensor;

namespace {

mt::dim_split over(const std::vector<int>& axes) { return mt::dim_split::over(axes); }

std::int64_t product(const std::vector<int>& v) {
  std::int64_t n = 1;
  for (int x : v) n *= x;
  return n;
}

struct rank2_case {
  std::vector<int> mesh;
  std::array<mt::dim_split, 2> splits;
  std::array<std::int64_t, 2> extents;
};

// Meshes [1], [3], [2x3], [4x2], [16x32]; splits over nothing, one axis, both axes (either
// order), two dims on two axes; extents even, uneven (7, 13) and smaller than their parts (2).
std::vector<rank2_case> cases() {
  std::vector<rank2_case> out;
  const std::vector<std::vector<int>> meshes{{1}, {3}, {2, 3}, {4, 2}, {16, 32}};
  const std::vector<std::array<std::int64_t, 2>> extents{{12, 6}, {7, 13}, {13, 7}, {2, 1}, {0, 5}};
  for (const auto& m : meshes) {
    std::vector<std::array<mt::dim_split, 2>> splits{{over({}), over({})}, {over({0}), over({})},
                                                               {over({}), over({0})}};
    if (m.size() == 2) {
      splits.push_back({over({0, 1}), over({})});
      splits.push_back({over({1, 0}), over({})});
      splits.push_back({over({0}), over({1})});
      splits.push_back({over({1}), over({0})});
    }
    for (const auto& s : splits)
      for (const auto& e : extents) out.push_back({m, s, e});
  }
  return out;
}

}  // namespace

TEST_CASE("block_rule: balanced parts, documented sizes, part_of inverts offset", "[placement]") {
  // 9 over 8: one part of 2, seven of 1 (never an empty part while n >= p).
  for (std::int64_t q = 0; q < 8; ++q) REQUIRE(mt::block_rule::size(9, 8, q) == (q == 0 ? 2 : 1));
  // A vocabulary of 50,257 over 8 processors: 50257 = 8 * 6282 + 1.
  REQUIRE(mt::block_rule::size(50257, 8, 0) == 6283);
  REQUIRE(mt::block_rule::size(50257, 8, 7) == 6282);
  REQUIRE(mt::block_rule::offset(50257, 8, 7) == 6283 + 6 * 6282);
  // 13 over 4: 4, 3, 3, 3 at 0, 4, 7, 10. 2 over 4: 1, 1, 0, 0.
  REQUIRE(mt::block_rule::offset(13, 4, 2) == 7);
  REQUIRE(mt::block_rule::size(13, 4, 0) == 4);
  REQUIRE(mt::block_rule::size(2, 4, 3) == 0);
  for (std::int64_t n : {0, 1, 2, 7, 13, 24, 50257})
    for (std::int64_t p : {1, 2, 3, 4, 6, 8}) {
      std::int64_t at = 0;
      for (std::int64_t q = 0; q < p; ++q) {
        REQUIRE(mt::block_rule::offset(n, p, q) == at);
        const auto s = mt::block_rule::size(n, p, q);
        REQUIRE(s >= n / p);
        REQUIRE(s <= n / p + 1);
        for (std::int64_t i = at; i < at + s; i += (s > 64 ? s / 7 : 1)) REQUIRE(mt::block_rule::part_of(n, p, i) == q);
        at += s;
      }
      REQUIRE(at == n);
    }
}

TEST_CASE("mesh_shapes: Mesh-TensorFlow's listing of the shapes of a processor count", "[placement]") {
  using shapes = std::vector<std::vector<int>>;
  REQUIRE(mt::mesh_shapes(8, 3) == shapes{{8}, {4, 2}, {2, 2, 2}});  // Mesh-TensorFlow's example
  REQUIRE(mt::mesh_shapes(8, 2) == shapes{{8}, {4, 2}});
  REQUIRE(mt::mesh_shapes(12, 3) == shapes{{12}, {6, 2}, {4, 3}, {3, 2, 2}});
  REQUIRE(mt::mesh_shapes(7, 4) == shapes{{7}});
  REQUIRE(mt::mesh_shapes(1, 2) == shapes{{1}});
  REQUIRE(mt::mesh_shapes(512, 2) == shapes{{512}, {256, 2}, {128, 4}, {64, 8}, {32, 16}});
  // 512 = 2^9: one shape per partition of 9, and there are 30 of those.
  const auto all = mt::mesh_shapes(512, 9);
  REQUIRE(all.size() == 30);
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::int64_t product = 1;
    for (std::size_t a = 0; a < all[i].size(); ++a) {
      product *= all[i][a];
      REQUIRE(all[i][a] >= 2);
      if (a > 0) REQUIRE(all[i][a] <= all[i][a - 1]);
    }
    REQUIRE(product == 512);
    if (i > 0) REQUIRE(all[i].size() >= all[i - 1].size());
    for (std::size_t j = 0; j < i; ++j) REQUIRE(all[i] != all[j]);
  }
  REQUIRE_THROWS_WITH(mt::mesh_shapes(0, 2), Catch::Matchers::ContainsSubstring("0 processors"));
  REQUIRE_THROWS_WITH(mt::mesh_shapes(8, 0), Catch::Matchers::ContainsSubstring("at most 0 axes"));
}

TEST_CASE("mesh_shape: ranks are row-major over the axes, last fastest", "[placement]") {
  const mt::mesh_shape s({"rows", "cols"}, {4, 2});
  REQUIRE(s.nprocs() == 8);
  REQUIRE(s.coords_of(5) == std::vector<int>{2, 1});
  for (int r = 0; r < 8; ++r) REQUIRE(s.rank_of(s.coords_of(r)) == r);
  // Sub-rank 3 of the processors differing only on rows, seen from (1, 1): row 3, col 1.
  REQUIRE(s.peer_coords(std::vector<int>{1, 1}, 1u, 3) == std::vector<int>{3, 1});
  REQUIRE(s.to_string() == "[rows=4, cols=2]");
  REQUIRE_THROWS_AS(mt::mesh_shape({"rows"}, {0}), mt::mesh_error);
}

TEST_CASE("placement: every processor's box tiles the tensor exactly once per replica", "[placement]") {
  for (const auto& c : cases()) {
    const mt::placement<2> p(c.splits, std::span<const int>(c.mesh), c.extents);
    const std::int64_t parts = p.parts(0) * p.parts(1);
    const std::int64_t replicas = product(c.mesh) / parts;
    INFO("mesh of " << product(c.mesh) << " extents " << c.extents[0] << "x" << c.extents[1] << " parts "
                    << p.parts(0) << "x" << p.parts(1));
    std::vector<std::int64_t> held(static_cast<std::size_t>(c.extents[0] * c.extents[1]), 0);
    std::int64_t total = 0;
    for (std::int64_t r = 0; r < p.nprocs(); ++r) {
      const auto b = p.box_of(r);
      total += b.size();
      for (std::int64_t i = 0; i < b.extent[0]; ++i)
        for (std::int64_t j = 0; j < b.extent[1]; ++j) ++held[(b.offset[0] + i) * c.extents[1] + b.offset[1] + j];
    }
    REQUIRE(total == replicas * c.extents[0] * c.extents[1]);
    for (auto h : held) REQUIRE(h == replicas);
  }
}

TEST_CASE("placement: owners(i) are exactly the processors whose box holds i", "[placement]") {
  for (const auto& c : cases()) {
    const mt::placement<2> p(c.splits, std::span<const int>(c.mesh), c.extents);
    for (std::int64_t i = 0; i < c.extents[0]; ++i)
      for (std::int64_t j = 0; j < c.extents[1]; ++j) {
        const auto owners = p.owners({i, j});
        std::vector<std::int64_t> holding;
        for (std::int64_t r = 0; r < p.nprocs(); ++r)
          if (p.box_of(r).contains({i, j})) holding.push_back(r);
        REQUIRE(owners == holding);
        REQUIRE(!owners.empty());
      }
  }
}

TEST_CASE("placement: intersecting with itself is the identity; overlaps partition each box", "[placement]") {
  const auto all = cases();
  for (const auto& c : all) {
    const mt::placement<2> p(c.splits, std::span<const int>(c.mesh), c.extents);
    for (std::int64_t r = 0; r < p.nprocs(); ++r) REQUIRE(mt::overlap(p, r, p, r) == p.box_of(r));
  }
  // Between two placements of one tensor on one mesh: what rank r holds under `from` is covered
  // by the overlaps with the ranks of `to`, once per replica of `to`.
  for (std::size_t a = 0; a < all.size(); ++a)
    for (std::size_t b = 0; b < all.size(); ++b) {
      if (all[a].mesh != all[b].mesh || all[a].extents != all[b].extents) continue;
      const mt::placement<2> from(all[a].splits, std::span<const int>(all[a].mesh), all[a].extents);
      const mt::placement<2> to(all[b].splits, std::span<const int>(all[b].mesh), all[b].extents);
      const std::int64_t to_replicas = to.nprocs() / (to.parts(0) * to.parts(1));
      for (std::int64_t r = 0; r < from.nprocs(); r += 1 + from.nprocs() / 16) {
        std::int64_t covered = 0;
        for (std::int64_t s = 0; s < to.nprocs(); ++s) covered += mt::overlap(from, r, to, s).size();
        REQUIRE(covered == from.box_of(r).size() * to_replicas);
      }
    }
}

TEST_CASE("placement: a [16 x 32] mesh with an uneven split, computed in one process", "[placement]") {
  const mt::mesh_shape shape({"rows", "cols"}, {16, 32});
  // vocab (50,257) over rows x cols = 512 parts, nested: 50257 = 16 * 3141 + 1 over rows (row 0
  // holds 3142), then 3142 = 32 * 98 + 6 and 3141 = 32 * 98 + 5 over cols.
  const mt::placement<2> p({over({0, 1}), over({})}, shape, {50257, 1024});
  REQUIRE(p.parts(0) == 512);
  REQUIRE(!p.even());
  REQUIRE(p.min_part_extent(0) == 98);
  REQUIRE(p.max_part_extent(0) == 99);
  REQUIRE(p.box_of(5).extent[0] == 99);
  REQUIRE(p.box_of(6).extent[0] == 98);
  REQUIRE(p.box_of(32).offset[0] == 3142);
  REQUIRE(p.box_of(36).extent[0] == 99);
  REQUIRE(p.box_of(37).extent[0] == 98);
  REQUIRE(p.box_of(511).offset[0] == 50257 - 98);
  REQUIRE(p.box_of(511).extent[1] == 1024);
  REQUIRE(p.owners({50256, 3}) == std::vector<std::int64_t>{511});
}

TEST_CASE("placement: a split over (a, b) refines the split over (a); parts stay within one element", "[placement]") {
  // 10 over 2 x 3, nested: 5 + 5 over the first axis, then 2, 2, 1 over the second.
  const std::vector<int> mesh{2, 3};
  const mt::placement<1> ab({over({0, 1})}, std::span<const int>(mesh), {10});
  std::vector<std::int64_t> sizes, offsets;
  for (std::int64_t q = 0; q < 6; ++q) {
    sizes.push_back(ab.part_extent(0, q));
    offsets.push_back(ab.part_offset(0, q));
  }
  REQUIRE(sizes == std::vector<std::int64_t>{2, 2, 1, 2, 2, 1});
  REQUIRE(offsets == std::vector<std::int64_t>{0, 2, 4, 5, 7, 9});
  // On every mesh and extent: each processor's box under (a, b) lies in its box under (a) (a
  // relayout adding a trailing axis only cuts locally), parts are n / P or n / P + 1, their
  // offsets increase with the part number, and part_of inverts them.
  for (const std::vector<int>& m : {std::vector<int>{2, 3}, std::vector<int>{3, 2}, std::vector<int>{4, 2},
                                    std::vector<int>{2, 2}, std::vector<int>{16, 32}})
    for (std::int64_t n : {0, 1, 2, 3, 5, 6, 7, 10, 13, 25, 50257})
      for (const auto& order : {std::vector<int>{0, 1}, std::vector<int>{1, 0}}) {
        INFO("mesh " << m[0] << "x" << m[1] << " extent " << n << " order " << order[0] << order[1]);
        const mt::placement<1> fine({over(order)}, std::span<const int>(m), {n});
        const mt::placement<1> coarse({over({order[0]})}, std::span<const int>(m), {n});
        const std::int64_t P = fine.parts(0);
        for (std::int64_t r = 0; r < fine.nprocs(); ++r) {
          const auto f = fine.box_of(r), c = coarse.box_of(r);
          REQUIRE(f.offset[0] >= c.offset[0]);
          REQUIRE(f.offset[0] + f.extent[0] <= c.offset[0] + c.extent[0]);
        }
        std::int64_t at = 0;
        for (std::int64_t q = 0; q < P; ++q) {
          REQUIRE(fine.part_offset(0, q) == at);
          const auto e = fine.part_extent(0, q);
          REQUIRE((e == n / P || e == n / P + 1));
          for (std::int64_t i = at; i < at + e; i += (e > 64 ? e / 7 : 1)) REQUIRE(fine.part_of(0, i) == q);
          at += e;
        }
        REQUIRE(at == n);
      }
}
