// relayout at 1, 2 and 4 ranks, between every ordered pair of layouts of a list: the gathered
// result is the gathered input exactly (relayout only moves data), relayouting back restores the
// input's own slice exactly, and the collectives counted equal relayout_plan (checked here too,
// because these pairs are instantiated here anyway); and, by hand, the plans of chosen pairs.
// Lists: every layout of line_layouts / grid_layouts over two dims (all pairs), and a
// representative set of three-dim grid layouts (all pairs) where a third dim stays split while
// the split moves: the full 19 x 19 three-dim product took minutes to compile, for the same cases.
// Kokkos::DefaultExecutionSpace only; reductions_test.softmax.cpp smoke-tests relayout on every space.
#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;

namespace {
using Exec = Kokkos::DefaultExecutionSpace;

// The counted calls per (collective, axes) equal the plan's (bytes are not part of a plan).
void require_plan(const mt::communicator& comm, const mt::comm_plan& plan) {
  require_counts(comm.counters(), plan.as_counts());
}

template <class Ls, class Dims, class M, class La>
void relayout_from(const M& m, const std::array<std::int64_t, Dims::size>& ext) {
  [&]<class... Ds>(list<Ds...>) {
    using A = mt::basic_tensor<double, La, Exec, Ds...>;
    const auto a = mt::random_normal<A>(m, ext, 5);
    // The replicated tensor is the reference: generated independently of any slicing.
    const auto h = mt::gather_all(mt::random_normal<mt::basic_tensor<double, mt::layout<M>, Exec, Ds...>>(m, ext, 5));
    REQUIRE(mt::gather_all(a) == h);
    auto mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a.view());
    for_each_type(Ls{}, [&]<class Lb>() {
      INFO(layout_name<La>() << " -> " << layout_name<Lb>());
      using B = mt::basic_tensor<double, Lb, Exec, Ds...>;
      m.reset_counters();
      const auto b = mt::relayout<B>(a);
      require_plan(m.communicator(), mt::relayout_plan<B, A>());
      REQUIRE(mt::gather_all(b) == h);
      m.reset_counters();
      const auto back = mt::relayout<A>(b);
      require_plan(m.communicator(), mt::relayout_plan<A, B>());
      auto again = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, back.view());
      REQUIRE(again.extent(0) == mine.extent(0));
      bool same = true;
      for (std::size_t n = 0; n < mine.extent(0); ++n) same = same && again(n) == mine(n);
      REQUIRE(same);
    });
  }(Dims{});
}
template <class M, class Ls, class Dims>
void all_pairs(const M& m, const std::array<std::int64_t, Dims::size>& ext) {
  for_each_type(Ls{}, [&]<class La>() { relayout_from<Ls, Dims, M, La>(m, ext); });
}

// Three-dim grid layouts: replicated, k fixed on c while the split on r moves between i and j,
// one dim over both axes in either order, and the axes swapped between dims.
using grid3 = list<mt::layout<grid>, mt::layout<grid, mt::split<i_, r_>, mt::split<k_, c_>>,
                   mt::layout<grid, mt::split<j_, r_>, mt::split<k_, c_>>, mt::layout<grid, mt::split<i_, r_, c_>>,
                   mt::layout<grid, mt::split<j_, c_, r_>>, mt::layout<grid, mt::split<k_, r_>, mt::split<i_, c_>>,
                   mt::layout<grid, mt::split<i_, c_>, mt::split<j_, r_>>>;
}  // namespace

TEST_CASE("relayout between every pair of layouts moves the data exactly", "[relayout][equivalence]") {
  // Extents divisible by 4 and different, so that a mix-up of dims changes the shape; then uneven
  // ones (over 2, 3, 4 and 6 parts), with a dim (2 or 3) smaller than 4 or 6 parts.
  const bool uneven = GENERATE(false, true);
  INFO((uneven ? "uneven extents" : "even extents"));
  const std::array<std::int64_t, 2> e2 = uneven ? std::array<std::int64_t, 2>{13, 3} : std::array<std::int64_t, 2>{8, 12};
  const std::array<std::int64_t, 3> e3 =
      uneven ? std::array<std::int64_t, 3>{7, 2, 13} : std::array<std::int64_t, 3>{4, 8, 12};
  SECTION("mesh [P], two dims") { all_pairs<line, line_layouts<line, i_, j_>, list<i_, j_>>(world_line(), e2); }
  SECTION("mesh [2x2] (or [P x 1], [2x3]), two dims") {
    all_pairs<grid, grid_layouts<i_, j_>, list<i_, j_>>(world_grid(), e2);
  }
  SECTION("mesh [2x2] (or [P x 1], [2x3]), three dims") {
    all_pairs<grid, grid3, list<i_, j_, k_>>(world_grid(), e3);
  }
  SECTION("mesh [3x2] at 6 ranks, [P x 1] otherwise, three dims") {
    const int p = world_size();
    all_pairs<grid, grid3, list<i_, j_, k_>>(p == 6 ? grid(MPI_COMM_WORLD, {3, 2}) : grid(MPI_COMM_WORLD, {p, 1}), e3);
  }
}

// Slices of 64 KiB and more come from the tensor memory cache, as do relayout's send and receive
// buffers: repeated relayouts, with earlier results alive or dropped, must not see each other's data.
TEST_CASE("relayout of large slices through the memory cache moves the data exactly", "[relayout][equivalence]") {
  auto m = world_line();
  using A = mt::basic_tensor<double, mt::layout<line, mt::split<i_, x_>>, Exec, i_, j_>;
  using B = mt::basic_tensor<double, mt::layout<line, mt::split<j_, x_>>, Exec, i_, j_>;
  using R = mt::basic_tensor<double, mt::layout<line>, Exec, i_, j_>;
  const std::array<std::int64_t, 2> ext{1024, 64};  // 512 KiB: 128 KiB or more per slice at 1-4 ranks
  const auto a = mt::random_normal<A>(m, ext, 7);
  const auto h = mt::gather_all(mt::random_normal<R>(m, ext, 7));
  std::vector<B> kept;
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    const auto b = mt::relayout<B>(a);        // alltoall: packed send, received into the result
    const auto back = mt::relayout<A>(b);     // alltoall: sent from the slice, unpacked
    const auto full = mt::relayout<R>(b);     // allgather, unpacked (j split)
    const auto full_a = mt::relayout<R>(back);  // allgather straight into the result (i split)
    REQUIRE(mt::gather_all(b) == h);
    REQUIRE(mt::gather_all(back) == h);
    REQUIRE(mt::gather_all(full) == h);
    REQUIRE(mt::gather_all(full_a) == h);
    if (round == 0) kept.push_back(b);
  }
  REQUIRE(mt::gather_all(kept.front()) == h);
}

// Where the axes a relayout exchanges over have size 1 (one processor; cols of [3 x 1] at 3 ranks),
// a processor's slice is the same box under both layouts: the result is the source's own slice,
// nothing copied, and the collective is still counted as the plan counts it. The gradient through
// it must not add into the shared slice.
TEST_CASE("a relayout over a group of one keeps the slice where it lies, counted as planned", "[relayout][equivalence]") {
  auto m = world_grid();
  using A = ten<mt::layout<grid, mt::split<i_, c_>>, i_, j_>;
  using B = ten<mt::layout<grid, mt::split<j_, c_>>, i_, j_>;
  const bool alone = m.communicator().size_over(grid::mask<c_>()) == 1;
  INFO("cols of size " << m.communicator().size_over(grid::mask<c_>()));
  auto a = mt::random_normal<A>(m, {6, 10}, 3);
  a.requires_grad();
  const auto before = mt::gather_all(a);
  m.reset_counters();
  const auto b = mt::relayout<B>(a);
  require_counts(m.communicator().counters(), counts({{mt::collective::alltoall, grid::mask<c_>(), 1}}));
  REQUIRE((b.view().data() == a.view().data()) == alone);
  REQUIRE(mt::gather_all(b) == before);
  const auto [da] = mt::gradient(mt::reduce_sum<i_, j_>(b * b + b), a);
  const auto got = mt::gather_all(da);
  REQUIRE(mt::gather_all(a) == before);
  for (std::size_t n = 0; n < before.size(); ++n) {  // 2 b + 1, its two b's added in either order
    const double want = 2 * before[n] + 1;
    REQUIRE(std::abs(got[n] - want) <= 1e-14 * (1 + std::abs(want)));
  }
}

namespace {
const std::array<std::int64_t, 2> ext{8, 12};
}  // namespace

TEST_CASE("relayout plans: alltoall when a split moves, allgather when it stops, nothing when it refines",
          "[relayout][comm_plan]") {
  auto m = world_grid();
  const unsigned r = grid::mask<r_>(), c = grid::mask<c_>();
  using mt::collective;
  using mt::layout;
  using mt::split;
  // One case: relayout from layout A to layout B of tensor<i, j>, with the expected calls.
  auto check = [&]<class A, class B>(mt::comm_counters want) {
    using TA = ten<A, i_, j_>;
    using TB = ten<B, i_, j_>;
    INFO(layout_name<A>() << " -> " << layout_name<B>());
    constexpr auto plan = mt::relayout_plan<TB, TA>();
    REQUIRE(plan.as_counts() == want);
    const auto a = mt::random_normal<TA>(m, ext, 9);
    m.reset_counters();
    const auto b = mt::relayout<TB>(a);
    require_counts(m.counters(), want);
    // Bytes: each collective sends this processor's whole slice once.
    for (const auto& [k, v] : m.counters()) REQUIRE(v.bytes == a.local_size() * std::int64_t(sizeof(double)));
  };
  check.operator()<layout<grid, split<i_, r_>>, layout<grid, split<j_, r_>>>(counts({{collective::alltoall, r, 1}}));
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<i_, r_>, split<j_, c_>>>(
      counts({{collective::alltoall, c, 1}}));
  check.operator()<layout<grid, split<i_, c_>, split<j_, r_>>, layout<grid, split<j_, r_, c_>>>(
      counts({{collective::alltoall, c, 1}}));
  // A split over both axes moving between dims, in either order: one alltoall over both.
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<j_, r_, c_>>>(
      counts({{collective::alltoall, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<j_, c_, r_>>>(
      counts({{collective::alltoall, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<j_, c_, r_>>>(
      counts({{collective::alltoall, r, 1}}));
  check.operator()<layout<grid, split<i_, r_>>, layout<grid, split<i_, r_, c_>>>(counts({}));
  check.operator()<layout<grid>, layout<grid, split<i_, c_>, split<j_, r_>>>(counts({}));
  check.operator()<layout<grid, split<i_, r_, c_>>, layout<grid, split<i_, r_>>>(counts({{collective::allgather, c, 1}}));
  check.operator()<layout<grid, split<i_, c_, r_>>, layout<grid, split<i_, r_, c_>>>(
      counts({{collective::allgather, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<i_, c_>, split<j_, r_>>>(
      counts({{collective::allgather, r | c, 1}}));
  check.operator()<layout<grid, split<i_, r_>, split<j_, c_>>, layout<grid, split<i_, r_>, split<j_, c_>, split<k_, r_>>>(
      counts({}));
}
