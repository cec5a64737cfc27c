// The collectives that slice, pad, concat, split_along, shift, halo_exchange, one_hot, gather,
// cumsum and top_k run equal their static plans (calls per collective and axis set), for every
// layout of meshes [P] and [2x2]; bytes are checked by hand for slice, shift, cumsum and gather.
#include <test_support.hpp>

#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;

namespace {
constexpr std::int64_t I = 4, J = 16, K = 4;
const std::array<std::int64_t, 3> ext{I, J, K};

template <class M>
std::int64_t bytes_of(const M& g, mt::collective kind, unsigned axes) {
  const auto it = g.counters().find({kind, axes});
  return it == g.counters().end() ? 0 : it->second.bytes;
}

template <class M, class Layouts>
void run_all(const M& g, Layouts layouts) {
  for_each_type(layouts, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, i_, j_, k_>;
    constexpr unsigned j_axes = L::template split_of<j_>().mask();
    constexpr std::int64_t d = sizeof(double);
    auto x = mt::random_normal<X>(g, ext, 1);
    auto y = mt::random_normal<X>(g, {I, 4, K}, 2);
    const std::int64_t lj = x.template local_extent<j_>();
    const std::int64_t min_part = x.placement().min_part_extent(X::template index_of<j_>());
    const std::int64_t rows = x.local_size() / (lj == 0 ? 1 : lj);  // local elements per j index

    g.reset_counters();
    (void)mt::slice<j_>(x, 2, 8);
    require_counts(g, mt::slice_plan<X, j_>());
    // When j is split, the whole local slice is gathered once.
    if constexpr (j_axes != 0) REQUIRE(bytes_of(g, mt::collective::allgather, j_axes) == x.local_size() * d);

    g.reset_counters();
    (void)mt::pad<j_>(x, 1, 3);
    require_counts(g, mt::pad_plan<X, j_>());

    g.reset_counters();
    (void)mt::concat<j_>(x, y);
    require_counts(g, mt::concat_plan<X, j_>());

    g.reset_counters();
    (void)mt::split_along<j_>(x, 4, 8, 4);
    require_counts(g, mt::split_along_plan<X, j_>());

    for (std::int64_t off : {3, -2, 11, -13})
      for (auto b : {mt::boundary::zero_fill, mt::boundary::wrap}) {
        INFO("shift " << off);
        g.reset_counters();
        (void)mt::shift<j_>(x, off, b);
        // The neighbour path applies while |offset| <= the smallest part of j (the documented
        // rule; the same on every rank, so that all take the same path when parts are uneven).
        const bool near = std::abs(off) <= min_part;
        require_counts(g, near ? mt::shift_plan<X, j_>() : mt::shift_general_plan<X, j_>());
        if constexpr (L::template split_of<j_>().count == 1)
          if (near) REQUIRE(bytes_of(g, mt::collective::shift, j_axes) == rows * std::abs(off) * d);
      }

    for (std::int64_t w : {2, 6}) {
      INFO("halo " << w);
      g.reset_counters();
      (void)mt::halo_exchange<j_>(x, w);
      require_counts(g, w <= min_part ? mt::halo_exchange_plan<X, j_>() : mt::halo_exchange_general_plan<X, j_>());
    }

    g.reset_counters();
    (void)mt::cumsum<j_>(x);
    constexpr auto cplan = mt::cumsum_plan<X, j_>();
    require_counts(g, cplan);
    // One total per (i, k) row crosses: exscan sends them once; allgather sends them once too.
    if constexpr (j_axes != 0) REQUIRE(bytes_of(g, cplan.steps[0].kind, j_axes) == rows * d);

    g.reset_counters();
    (void)mt::top_k<j_, l_>(x, 4);
    require_counts(g, mt::top_k_plan<X, j_, l_>());

    using Ids2 = mt::tensor<std::int32_t, L, i_, j_>;
    Ids2 ids2(g, {I, J});
    g.reset_counters();
    (void)mt::one_hot<k_>(ids2, K);
    require_counts(g, mt::one_hot_plan<Ids2, k_>());

    if constexpr ((j_axes & L::template split_of<i_>().mask()) == 0) {
      using Table = mt::tensor<double, L, j_, k_>;
      using Ids = mt::tensor<std::int32_t, L, i_>;
      auto table = mt::random_normal<Table>(g, {J, K}, 3);
      Ids ids(g, {I});
      g.reset_counters();
      auto out = mt::gather<j_>(table, ids);
      require_counts(g, mt::gather_plan<Table, Ids, j_>());
      // The lookup's allreduce over vocab's axes moves the local output block.
      if constexpr (j_axes != 0) REQUIRE(bytes_of(g, mt::collective::allreduce, j_axes) == out.local_size() * d);
    }
  });
}
}  // namespace

TEST_CASE("data movement ops communicate exactly their plan", "[comm_plan]") {
  SECTION("mesh [P]") { run_all(world_line(), line_layouts<line, i_, j_, k_>{}); }
  SECTION("mesh [2x2] (or [P x 1])") { run_all(world_grid(), grid_layouts<i_, j_, k_>{}); }
}

TEST_CASE("plans are derived from types alone", "[comm_plan]") {
  using L1 = mt::layout<grid, mt::split<j_, r_, c_>>;  // rule in mesh order: exscan
  using L2 = mt::layout<grid, mt::split<j_, c_, r_>>;  // rule against mesh order: allgather
  using X1 = mt::tensor<double, L1, i_, j_, k_>;
  using X2 = mt::tensor<double, L2, i_, j_, k_>;
  using X0 = mt::tensor<double, mt::layout<grid>, i_, j_, k_>;
  STATIC_REQUIRE(mt::cumsum_plan<X1, j_>().steps[0].kind == mt::collective::exscan);
  STATIC_REQUIRE(mt::cumsum_plan<X2, j_>().steps[0].kind == mt::collective::allgather);
  STATIC_REQUIRE(mt::cumsum_plan<X0, j_>().empty());
  STATIC_REQUIRE(mt::shift_plan<X1, j_>().steps[0].kind == mt::collective::allgather);
  // two allgathers over j's axes: one step of two calls (a plan holds distinct pairs)
  STATIC_REQUIRE(mt::concat_plan<X1, j_>().size == 1 && mt::concat_plan<X1, j_>().steps[0].calls == 2);
  STATIC_REQUIRE(mt::slice_plan<X1, i_>().empty());
}
