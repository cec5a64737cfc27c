// The zigzag placement's laws (zigzag<Dim, Axes...>, geometry/placement.hpp), in one process and
// without MPI: pieces cover the dim once, part_of agrees with them, parts differ by at most one
// element, one part is the identity, the general relayout's overlaps move every element to its new
// place (contiguous -> zigzag -> contiguous, simulated on host arrays), and the causal work per part
// is level where contiguous blocks are not (the reason the placement exists).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/geometry/placement.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <vector>

namespace mt = meshtensor;

namespace {

mt::dim_split zig(std::initializer_list<int> axes) { return mt::dim_split::zigzag_over(axes); }
mt::dim_split cut(std::initializer_list<int> axes) { return mt::dim_split::over(axes); }

// A mesh and a zigzag split of one dim over some of its axes (P = the product of their sizes).
struct mesh_case {
  std::vector<int> mesh;
  mt::dim_split split;
};
std::vector<mesh_case> meshes() {
  return {{{1}, zig({0})},       {{2}, zig({0})},    {{3}, zig({0})},    {{4}, zig({0})},
          {{2, 2}, zig({0, 1})}, {{2, 3}, zig({1, 0})}, {{2, 3}, zig({1})}};
}
const std::vector<std::int64_t> lengths{0, 1, 3, 7, 8, 12, 13, 17, 24, 25};

std::vector<int> coords_of(const std::vector<int>& mesh, std::int64_t rank) {
  std::vector<int> c(mesh.size());
  mt::coords_of(rank, mesh, c);
  return c;
}
std::int64_t nprocs(const std::vector<int>& mesh) {
  std::int64_t n = 1;
  for (int s : mesh) n *= s;
  return n;
}

// The sum over the positions i a part holds of the keys a causal mask lets it see (i + 1).
std::int64_t causal_work(const mt::placement<1>& p, std::int64_t part) {
  std::int64_t w = 0;
  for (const auto& r : p.ranges(0, part))
    for (std::int64_t i = r.offset[0]; i < r.offset[0] + r.extent[0]; ++i) w += i + 1;
  return w;
}

}  // namespace

TEST_CASE("zigzag: pieces cover the dim once, in local order, and part_of agrees", "[zigzag]") {
  for (const auto& m : meshes())
    for (const std::int64_t n : lengths) {
      CAPTURE(m.mesh, n);
      const mt::placement<1> p({m.split}, std::span<const int>(m.mesh), {n});
      const std::int64_t P = p.parts(0);
      // Every part once: a processor per part (the others along unsplit axes are replicas).
      std::vector<int> covered(static_cast<std::size_t>(n), 0);
      std::vector<bool> part_seen(static_cast<std::size_t>(P), false);
      for (std::int64_t r = 0; r < nprocs(m.mesh); ++r) {
        const auto c = coords_of(m.mesh, r);
        const std::int64_t q = p.part_at(0, c);
        const auto pieces = p.pieces_at(c);
        // Pieces tile the local array in order: each starts where the last ended.
        std::int64_t local = 0;
        for (const auto& pc : pieces) {
          REQUIRE(pc.frame.extent[0] == p.part_extent(0, q));
          REQUIRE(pc.local_offset()[0] == local);
          local += pc.held.extent[0];
          for (std::int64_t i = pc.held.offset[0]; i < pc.held.offset[0] + pc.held.extent[0]; ++i) {
            REQUIRE(p.part_of(0, i) == q);
            if (!part_seen[q]) ++covered[i];
          }
        }
        REQUIRE(local == p.part_extent(0, q));
        REQUIRE(local == p.local_extents(c)[0]);
        part_seen[q] = true;
      }
      for (std::int64_t i = 0; i < n; ++i) REQUIRE(covered[i] == 1);
      // Chunk q first, then chunk 2P - 1 - q.
      for (std::int64_t q = 0; q < P; ++q) {
        const auto r = p.ranges(0, q);
        REQUIRE(r[0].offset[0] == mt::block_rule::offset(n, 2 * P, q));
        REQUIRE(r[1].offset[0] == mt::block_rule::offset(n, 2 * P, 2 * P - 1 - q));
      }
    }
}

TEST_CASE("zigzag: parts differ by at most one element (as contiguous blocks do)", "[zigzag]") {
  for (const auto& m : meshes())
    for (std::int64_t n = 0; n < 60; ++n) {
      CAPTURE(m.mesh, n);
      const mt::placement<1> p({m.split}, std::span<const int>(m.mesh), {n});
      std::int64_t lo = n, hi = 0, total = 0;
      for (std::int64_t q = 0; q < p.parts(0); ++q) {
        lo = std::min(lo, p.part_extent(0, q));
        hi = std::max(hi, p.part_extent(0, q));
        total += p.part_extent(0, q);
      }
      REQUIRE(total == n);
      REQUIRE(hi - lo <= 1);
      REQUIRE(p.min_part_extent(0) == lo);
      REQUIRE(p.max_part_extent(0) == hi);
    }
}

TEST_CASE("zigzag: one part is the identity", "[zigzag]") {
  for (const std::int64_t n : lengths) {
    const std::vector<int> mesh{1};
    const mt::placement<2> p({zig({0}), cut({})}, std::span<const int>(mesh), {n, 3});
    const std::array<int, 1> c{0};
    // Every piece sits in the local array where it sits in the global one.
    for (const auto& pc : p.pieces_at(c)) {
      REQUIRE(pc.frame.offset == std::array<std::int64_t, 2>{0, 0});
      REQUIRE(pc.frame.extent == std::array<std::int64_t, 2>{n, 3});
    }
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(p.part_of(0, i) == 0);
  }
}

TEST_CASE("zigzag: one box per processor is refused by name; the split reads as zigzag", "[zigzag]") {
  const std::vector<int> mesh{2};
  const mt::placement<1> p({zig({0})}, std::span<const int>(mesh), {8});
  const std::array<int, 1> c{1};
  REQUIRE_THROWS_WITH(p.box_at(c), Catch::Matchers::ContainsSubstring("dim 0 is cut zigzag"));
  REQUIRE_THROWS_WITH(p.part_offset(0, 1), Catch::Matchers::ContainsSubstring("ask pieces_at"));
  REQUIRE(mt::split_string(zig({0}), mt::mesh_shape({"ctx"}, {2})) == "ctx(2) zigzag");
  REQUIRE_FALSE(zig({0}) == cut({0}));
}

TEST_CASE("zigzag: relayouts to and from it are one general exchange over the axes that change, or local", "[zigzag]") {
  using K = mt::relayout_kind;
  const std::array<mt::dim_split, 2> contiguous{cut({0}), cut({})}, zigzag{zig({0}), cut({})},
      zigzag_other_dim{zig({0}), cut({1})}, replicated{};
  CHECK(mt::analyze_relayout<2>(contiguous, zigzag) == mt::relayout_step{K::general, 1u});
  CHECK(mt::analyze_relayout<2>(zigzag, contiguous) == mt::relayout_step{K::general, 1u});
  CHECK(mt::analyze_relayout<2>(zigzag, replicated) == mt::relayout_step{K::general, 1u});
  CHECK(mt::analyze_relayout<2>(zigzag, zigzag) == mt::relayout_step{K::share, 0u});
  // The zigzag dim unchanged and the other dim only adding an axis: local; dropping it: the other
  // dim's axis alone.
  CHECK(mt::analyze_relayout<2>(zigzag, zigzag_other_dim) == mt::relayout_step{K::local, 0u});
  CHECK(mt::analyze_relayout<2>(zigzag_other_dim, zigzag) == mt::relayout_step{K::general, 2u});
  const std::array<mt::dim_split, 2> zigzag_other_two{zig({0}), cut({1, 2})}, zigzag_moved{zig({0}), cut({2})};
  CHECK(mt::analyze_relayout<2>(zigzag_other_dim, zigzag_other_two) == mt::relayout_step{K::local, 0u});
  CHECK(mt::analyze_relayout<2>(zigzag_other_dim, zigzag_moved) == mt::relayout_step{K::general, 6u});
  // Never a reduce_scatter (it packs boxes).
  CHECK_FALSE(mt::scatters_over<2>(replicated, zigzag, 1u));
}

// The general relayout (ops/relayout.hpp's move_pieces) without MPI: every processor's local array
// under `from` holds the global row-major index of each element; the arrays under `to` are built by
// copying, for every peer that sends (the one agreeing with the receiver on the axes `from` leaves
// unsplit), the overlaps of the sender's pieces with the receiver's through each piece's frame. Each
// new array must hold the global indices of its own pieces.
namespace {
using local_arrays = std::vector<std::vector<std::int64_t>>;

std::int64_t local_index(const mt::piece<2>& pc, const std::array<std::int64_t, 2>& g) {
  return (g[0] - pc.frame.offset[0]) * pc.frame.extent[1] + (g[1] - pc.frame.offset[1]);
}

local_arrays filled(const mt::placement<2>& p, const std::vector<int>& mesh) {
  local_arrays out(static_cast<std::size_t>(nprocs(mesh)));
  for (std::int64_t r = 0; r < nprocs(mesh); ++r) {
    const auto c = coords_of(mesh, r);
    out[r].assign(static_cast<std::size_t>(p.local_size(c)), -1);
    for (const auto& pc : p.pieces_at(c))
      for (std::int64_t i = pc.held.offset[0]; i < pc.held.offset[0] + pc.held.extent[0]; ++i)
        for (std::int64_t j = pc.held.offset[1]; j < pc.held.offset[1] + pc.held.extent[1]; ++j)
          out[r][local_index(pc, {i, j})] = i * p.extents()[1] + j;
  }
  return out;
}

local_arrays moved(const local_arrays& src, const mt::placement<2>& from, const mt::placement<2>& to,
                   const std::vector<int>& mesh) {
  unsigned from_axes = 0;
  for (const auto& s : from.splits()) from_axes |= s.mask();
  local_arrays out(src.size());
  for (std::int64_t r = 0; r < nprocs(mesh); ++r) {
    const auto c = coords_of(mesh, r);
    out[r].assign(static_cast<std::size_t>(to.local_size(c)), -1);
    std::int64_t received = 0;
    for (std::int64_t s = 0; s < nprocs(mesh); ++s) {
      const auto cs = coords_of(mesh, s);
      bool sends = true;
      for (std::size_t a = 0; a < mesh.size(); ++a)
        if (!((from_axes >> a) & 1u) && cs[a] != c[a]) sends = false;
      if (!sends) continue;
      mt::for_each_overlap(from.pieces_at(cs), to.pieces_at(c),
                           [&](const mt::piece<2>& a, const mt::piece<2>& b, const mt::box<2>& region) {
                             for (std::int64_t i = region.offset[0]; i < region.offset[0] + region.extent[0]; ++i)
                               for (std::int64_t j = region.offset[1]; j < region.offset[1] + region.extent[1]; ++j)
                                 out[r][local_index(b, {i, j})] = src[s][local_index(a, {i, j})];
                             received += region.size();
                           });
    }
    REQUIRE(received == to.local_size(c));  // each element once
  }
  return out;
}
}  // namespace

TEST_CASE("zigzag: the general relayout's overlaps compose contiguous -> zigzag -> contiguous to the identity",
          "[zigzag]") {
  struct relayout_case {
    std::vector<int> mesh;
    std::array<mt::dim_split, 2> contiguous, zigzag;
  };
  const std::vector<relayout_case> cases{
      {{2}, {cut({0}), cut({})}, {zig({0}), cut({})}},
      {{3}, {cut({}), cut({})}, {zig({0}), cut({})}},
      {{4}, {cut({0}), cut({})}, {zig({0}), cut({})}},
      {{2, 2}, {cut({0}), cut({1})}, {zig({0, 1}), cut({})}},
      {{2, 3}, {cut({1}), cut({0})}, {zig({1}), cut({0})}},
      {{2, 3}, {cut({0}), cut({})}, {zig({1}), cut({})}},   // a replica axis on the way there
      {{3, 2}, {cut({}), cut({0, 1})}, {cut({}), zig({1, 0})}},
  };
  for (const auto& rc : cases)
    for (const std::array<std::int64_t, 2> ext : {std::array<std::int64_t, 2>{12, 5}, {13, 4}, {3, 7}, {25, 2}}) {
      CAPTURE(rc.mesh, ext);
      const std::span<const int> sizes(rc.mesh);
      const mt::placement<2> a(rc.contiguous, sizes, ext), z(rc.zigzag, sizes, ext);
      const auto start = filled(a, rc.mesh);
      const auto there = moved(start, a, z, rc.mesh);
      REQUIRE(there == filled(z, rc.mesh));
      REQUIRE(moved(there, z, a, rc.mesh) == start);
    }
}

TEST_CASE("zigzag: the causal work per part is level; contiguous blocks' is not", "[zigzag]") {
  // Work of a part: the (query i, key j <= i) pairs of the positions it holds. Zigzag parts differ
  // by at most 2n (none when 2P divides n); contiguous parts by about n^2 (P - 1) / P^2.
  for (const int P : {1, 2, 3, 4})
    for (std::int64_t n = 0; n < 200; ++n) {
      CAPTURE(P, n);
      const std::vector<int> mesh{P};
      const mt::placement<1> z({zig({0})}, std::span<const int>(mesh), {n}), c({cut({0})}, std::span<const int>(mesh), {n});
      std::int64_t zlo = INT64_MAX, zhi = 0, clo = INT64_MAX, chi = 0;
      for (std::int64_t q = 0; q < P; ++q) {
        zlo = std::min(zlo, causal_work(z, q)), zhi = std::max(zhi, causal_work(z, q));
        clo = std::min(clo, causal_work(c, q)), chi = std::max(chi, causal_work(c, q));
      }
      REQUIRE(zhi - zlo <= 2 * n);
      if (n % (2 * P) == 0) REQUIRE(zhi == zlo);
      if (P > 1 && n >= 64) REQUIRE(chi - clo > 8 * n);
    }
}

// relayout refuses a tensor whose largest slice passes MPI's int count from this bound, the same on
// every rank; it must be the largest slice any processor holds, not more, not less.
TEST_CASE("placement: max_local_size is the largest slice of any processor (split, zigzag, uneven)", "[zigzag]") {
  const std::vector<int> mesh{2, 3};
  const std::vector<std::array<mt::dim_split, 2>> layouts{
      {zig({0}), cut({1})}, {cut({1}), zig({0})}, {zig({0, 1}), cut({})}, {cut({0}), cut({})}, {cut({}), cut({})}};
  for (const auto& splits : layouts)
    for (const std::int64_t a : {0, 1, 5, 13})
      for (const std::int64_t b : {1, 4, 7}) {
        INFO("extents " << a << " x " << b);
        const mt::placement<2> p(splits, std::span<const int>(mesh), {a, b});
        std::int64_t largest = 0;
        for (std::int64_t r = 0; r < nprocs(mesh); ++r) largest = std::max(largest, p.local_size(coords_of(mesh, r)));
        REQUIRE(p.max_local_size() == largest);
      }
}
