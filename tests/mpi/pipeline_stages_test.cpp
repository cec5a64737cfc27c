// pipeline::stages and pipeline::run (pipeline/stages.hpp), one stage per rank: a chain of stages
// y = x (.) w_s + x, the last stage's loss a weighted sum, gives the loss and the gradients of the
// same chain computed whole on one processor, under GPipe and 1F1B, with 1 to 5 microbatches; the
// sends counted are those the schedule implies; a planned stage counts the same sends; a stage
// count that does not divide the ranks is an error naming both.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
namespace pl = meshtensor::pipeline;

namespace {
using L = mt::layout<line>;
using X = ten<L, i_, j_>;
using W = ten<L, j_>;
constexpr std::int64_t R = 3, J = 5;

X input_of(const line& g, int mb) { return mt::random_normal<X>(g, {R, J}, 100 + static_cast<std::uint64_t>(mb)); }
W weight_of(const line& g, int s) { return mt::random_normal<W>(g, {J}, 10 + static_cast<std::uint64_t>(s)); }
X apply(const X& x, const W& w) { return mt::einsum<i_, j_>(x, w) + x; }

struct chain_stage {
  using activation = X;
  const pl::stages<line>& st;
  int microbatches;
  std::vector<W> w;
  std::optional<std::tuple<std::vector<W>>> grads;
  mutable double loss_sum = 0;

  activation::extents_type extents(int) const { return {R, J}; }
  X forward(int mb, const X* in) const { return apply(in ? *in : input_of(st.mesh(), mb), w[0]); }
  ten<L> loss(int mb, const X& y) const {
    auto l = weighted_sum(y, 1000 + static_cast<std::uint64_t>(mb));
    if (!st.planned()) loss_sum += mt::item(l);
    return l;
  }
  auto params() { return std::tie(w); }
  void accumulate(std::tuple<std::vector<W>> g) {
    if (!grads) {
      grads = std::move(g);
      return;
    }
    const mt::no_grad plain;
    std::get<0>(*grads)[0] = std::get<0>(*grads)[0] + std::get<0>(g)[0];
  }
};

// The whole chain on this processor alone: the loss and every stage's gradient.
std::pair<double, std::vector<std::vector<double>>> whole_chain(int stages, int microbatches) {
  const line self(MPI_COMM_SELF, {1});
  std::vector<W> w;
  for (int s = 0; s < stages; ++s) w.push_back(weight_of(self, s).requires_grad());
  std::optional<ten<L>> total;
  for (int mb = 0; mb < microbatches; ++mb) {
    X x = input_of(self, mb);
    for (const auto& ws : w) x = apply(x, ws);
    auto l = weighted_sum(x, 1000 + static_cast<std::uint64_t>(mb));
    total = total ? ten<L>(*total + l) : l;
  }
  const auto [g] = mt::gradient(*total, w);
  std::vector<std::vector<double>> grads;
  for (const auto& t : g) grads.push_back(mt::gather_all(t));
  return {mt::item(*total), grads};
}
}  // namespace

TEST_CASE("a pipelined chain equals the whole chain, under both schedules") {
  const int stages = world_size();
  for (auto kind : {pl::schedule_kind::gpipe, pl::schedule_kind::one_f_one_b})
    for (int m : {1, 2, 5}) {
      INFO(pl::to_string(kind) << ", " << m << " microbatches, " << stages << " stages");
      pl::stages<line> st(MPI_COMM_WORLD, stages, {1});
      REQUIRE(st.index() == world_rank());
      chain_stage stage{st, m, {weight_of(st.mesh(), st.index()).requires_grad()}, {}, 0};
      st.mesh().reset_counters();
      const auto order = pl::schedule(kind, st.index(), stages, m);
      const auto stats = pl::run(order, st, stage);
      REQUIRE(stats.max_in_flight == pl::max_in_flight(order));
      REQUIRE(stats.busy_seconds <= stats.total_seconds);
      const auto [loss, grads] = whole_chain(stages, m);
      if (st.last()) require_close(std::vector<double>{stage.loss_sum}, std::vector<double>{loss}, 1e-12);
      require_close(mt::gather_all(std::get<0>(*stage.grads)[0]), grads[st.index()], 1e-12);
      // A send per microbatch forward (but from the last stage) and backward (but from the first).
      const std::int64_t sends = (st.last() ? 0 : m) + (st.first() ? 0 : m);
      const auto counted = st.mesh().counters();
      const auto it = counted.find({mt::collective::send, 0u});
      REQUIRE((it == counted.end() ? 0 : it->second.calls) == sends);
      if (sends > 0) REQUIRE(it->second.bytes == sends * R * J * 8);
      // The same stage planned counts the same sends.
      auto planned = pl::stages<line>::planned(stages, st.index(), {1});
      chain_stage planned_stage{planned, m, {weight_of(planned.mesh(), st.index()).requires_grad()}, {}, 0};
      (void)pl::run(order, planned, planned_stage);
      const auto pc = planned.mesh().counters();
      const auto pit = pc.find({mt::collective::send, 0u});
      REQUIRE((pit == pc.end() ? 0 : pit->second.calls) == sends);
    }
}

TEST_CASE("stages that do not divide the ranks: an error naming both") {
  const int n = world_size();
  REQUIRE_THROWS_WITH(pl::stages<line>(MPI_COMM_WORLD, n + 1, {1}),
                      Catch::Matchers::ContainsSubstring(mt::detail::cat(n + 1, " stages of 1 processors need ", n + 1,
                                                                         " ranks; the communicator has ", n)));
}
