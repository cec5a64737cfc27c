// pipeline::stages and pipeline::run (pipeline/stages.hpp), one stage per rank: a chain of stages
// y = x (.) w_s + x, the last stage's loss a weighted sum, gives the loss and the gradients of the
// same chain computed whole on one processor, under GPipe and 1F1B, with 1 to 5 microbatches; the
// sends counted are those the schedule implies; a planned stage counts the same sends; a stage
// count that does not divide the ranks is an error naming both. With two processors per stage
// (data parallelism inside it) the weights' gradients are reduced once per step; accumulate_gradient
// and take_gradients, which run() builds on, are checked on their own.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
namespace pl = meshtensor::pipeline;

namespace {
constexpr std::int64_t R = 4, J = 5;

// A stage's tensors under layout L: one processor per stage ({1}), or two splitting the rows
// (data parallelism inside the stage).
template <class L>
struct chain_types {
  using X = ten<L, i_, j_>;
  using W = ten<L, j_>;
  static X input_of(const line& g, int mb) { return mt::random_normal<X>(g, {R, J}, 100 + static_cast<std::uint64_t>(mb)); }
  static W weight_of(const line& g, int s) { return mt::random_normal<W>(g, {J}, 10 + static_cast<std::uint64_t>(s)); }
  static X apply(const X& x, const W& w) { return mt::einsum<i_, j_>(x, w) + x; }
};

template <class L>
struct chain_stage : chain_types<L> {
  using typename chain_types<L>::X;
  using typename chain_types<L>::W;
  using activation = X;
  const pl::stages<line>& st;
  int microbatches;
  std::vector<W> w;
  std::optional<std::tuple<std::vector<W>>> grads;
  mutable double loss_sum = 0;

  chain_stage(const pl::stages<line>& s, int m)
      : st(s), microbatches(m), w{chain_types<L>::weight_of(s.mesh(), s.index()).requires_grad()} {}
  typename activation::extents_type extents(int) const { return {R, J}; }
  X forward(int mb, const X* in) const { return this->apply(in ? *in : this->input_of(st.mesh(), mb), w[0]); }
  ten<L> loss(int mb, const X& y) const {
    auto l = weighted_sum(y, 1000 + static_cast<std::uint64_t>(mb));
    if (!st.planned()) loss_sum += mt::item(l);
    return l;
  }
  auto params() { return std::tie(w); }
  void step_gradients(std::tuple<std::vector<W>>&& g) { grads = std::move(g); }
};

// The whole chain on this processor alone: the loss and every stage's gradient.
std::pair<double, std::vector<std::vector<double>>> whole_chain(int stages, int microbatches) {
  using C = chain_types<mt::layout<line>>;
  const line self(MPI_COMM_SELF, {1});
  std::vector<C::W> w;
  for (int s = 0; s < stages; ++s) w.push_back(C::weight_of(self, s).requires_grad());
  std::optional<ten<mt::layout<line>>> total;
  for (int mb = 0; mb < microbatches; ++mb) {
    C::X x = C::input_of(self, mb);
    for (const auto& ws : w) x = C::apply(x, ws);
    auto l = weighted_sum(x, 1000 + static_cast<std::uint64_t>(mb));
    total = total ? ten<mt::layout<line>>(*total + l) : l;
  }
  const auto [g] = mt::gradient(*total, w);
  std::vector<std::vector<double>> grads;
  for (const auto& t : g) grads.push_back(mt::gather_all(t));
  return {mt::item(*total), grads};
}

std::int64_t calls_of(const mt::comm_counters& c, mt::collective kind, unsigned axes) {
  const auto it = c.find({kind, axes});
  return it == c.end() ? 0 : it->second.calls;
}
}  // namespace

TEST_CASE("a pipelined chain equals the whole chain, under both schedules") {
  const int stages = world_size();
  for (auto kind : {pl::schedule_kind::gpipe, pl::schedule_kind::one_f_one_b})
    for (int m : {1, 2, 5}) {
      INFO(pl::to_string(kind) << ", " << m << " microbatches, " << stages << " stages");
      pl::stages<line> st(MPI_COMM_WORLD, stages, {1});
      REQUIRE(st.index() == world_rank());
      chain_stage<mt::layout<line>> stage(st, m);
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
      chain_stage<mt::layout<line>> planned_stage(planned, m);
      (void)pl::run(order, planned, planned_stage);
      const auto pc = planned.mesh().counters();
      const auto pit = pc.find({mt::collective::send, 0u});
      REQUIRE((pit == pc.end() ? 0 : pit->second.calls) == sends);
    }
}

TEST_CASE("data parallelism inside a stage: the weights' gradients reduced once per step, not per microbatch") {
  if (world_size() % 2 != 0) SKIP("stages of two processors need an even rank count");
  using L = mt::layout<line, mt::split<i_, x_>>;
  const int stages = world_size() / 2;
  for (int m : {1, 3}) {
    INFO(m << " microbatches, " << stages << " stages of 2 processors");
    pl::stages<line> st(MPI_COMM_WORLD, stages, {2});
    chain_stage<L> stage(st, m);
    st.mesh().reset_counters();
    (void)pl::run(pl::schedule(pl::schedule_kind::one_f_one_b, st.index(), stages, m), st, stage);
    const auto counted = st.mesh().counters();
    // w's gradient is a partial sum over x (the rows are split) in every microbatch: one
    // allreduce of J doubles at the step's end. The input's gradient, sent back, is whole on each
    // processor (x (.) w keeps the rows split); the last stage's losses sum over the split rows,
    // an allreduce of one double each.
    const auto calls = calls_of(counted, mt::collective::allreduce, 1u);
    const auto bytes = calls ? counted.at({mt::collective::allreduce, 1u}).bytes : 0;
    if (!st.last()) CHECK(calls == 1);
    CHECK(bytes == J * 8 + (calls - 1) * 8);
    const auto [loss, grads] = whole_chain(stages, m);
    require_close(mt::gather_all(std::get<0>(*stage.grads)[0]), grads[st.index()], 1e-12);
    if (st.last()) require_close(std::vector<double>{stage.loss_sum}, std::vector<double>{loss}, 1e-12);
  }
}

TEST_CASE("accumulate_gradient and take_gradients: the gradient of a sum, reduced once") {
  const line g = world_line();
  using L = mt::layout<line, mt::split<i_, x_>>;
  using X = ten<L, i_, j_>;
  using W = ten<L, j_>;
  auto w = mt::random_normal<W>(g, {J}, 7).requires_grad();
  const auto x1 = mt::random_normal<X>(g, {6, J}, 8), x2 = mt::random_normal<X>(g, {6, J}, 9);
  const auto l1 = weighted_sum(mt::einsum<i_, j_>(x1, w), 11), l2 = weighted_sum(mt::einsum<i_, j_>(x2, w), 12);
  const auto [want] = mt::gradient(ten<L>(l1 + l2), w);
  const auto a1 = weighted_sum(mt::einsum<i_, j_>(x1, w), 11), a2 = weighted_sum(mt::einsum<i_, j_>(x2, w), 12);
  g.reset_counters();
  mt::accumulate_gradient(a1, w);
  mt::accumulate_gradient(a2, w);
  if (world_size() > 1) CHECK(calls_of(g.counters(), mt::collective::allreduce, 1u) == 0);  // still partial sums
  const auto [got] = mt::take_gradients(w);
  if (world_size() > 1) CHECK(calls_of(g.counters(), mt::collective::allreduce, 1u) == 1);
  require_close(mt::gather_all(got), mt::gather_all(want), 1e-12);
  // Taken: the next accumulation starts from nothing.
  mt::accumulate_gradient(weighted_sum(mt::einsum<i_, j_>(x1, w), 11), w);
  const auto [again] = mt::take_gradients(w);
  const auto [only_first] = mt::gradient(l1, w);
  require_close(mt::gather_all(again), mt::gather_all(only_first), 1e-12);
  // A parameter that is an op's result: its held gradient would be pushed on twice.
  const W doubled = w * 2.0;
  REQUIRE_THROWS_WITH(mt::accumulate_gradient(weighted_sum(mt::einsum<i_, j_>(x1, doubled), 11), doubled),
                      Catch::Matchers::ContainsSubstring("is the result of an op, not a leaf"));
}

TEST_CASE("stages that do not divide the ranks: an error naming both") {
  const int n = world_size();
  REQUIRE_THROWS_WITH(pl::stages<line>(MPI_COMM_WORLD, n + 1, {1}),
                      Catch::Matchers::ContainsSubstring(mt::detail::cat(n + 1, " stages of 1 processors need ", n + 1,
                                                                         " ranks; the communicator has ", n)));
}
