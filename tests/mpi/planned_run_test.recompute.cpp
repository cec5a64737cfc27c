// Recompute (each block computed again in the backward pass) and the gradients' allreduces (partials
// over the same axes summed first, weight gradients in buckets), real and planned (a TU of
// mpi_planned_run_test: see planned_run.hpp).
#include <catch2/matchers/catch_matchers_string.hpp>

#include "planned_run.hpp"

using namespace tst;
using namespace tst::planned_run;

namespace {
struct stack_run {
  float loss = 0;
  std::vector<std::vector<float>> grads;
  mt::comm_counters counters, block_counters;
  std::optional<mt::plan_report> report;
};

// Three Transformer blocks (sharing their weights) on the embedded ids, each block recomputed in
// the backward pass or not; loss and gradients of every weight, collectives, and a plan's report.
template <class L>
stack_run block_stack_step(const grid& g, bool recompute) {
  using X = mt::tensor<float, L, batch, length, d_model>;
  block_weights<L> w(g);
  auto params = w.tie();
  auto& [emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits] = w;
  const auto [x_ids, y] = ids_and_labels<L>(g);
  // With dropout: its mask must come out the same when the block runs again.
  const auto block = [&](const X& in) {
    const X a = in + nn::causal_attention<length, memory_length, d_model, heads, d_kv>(nn::layer_norm<d_model>(in, scale, bias), wq, wk, wv, wo);
    return a + nn::dropout(nn::feed_forward<d_model, d_ff>(nn::layer_norm<d_model>(a, scale, bias), w_in, w_out), 0.2, 11, 1);
  };
  stack_run r;
  g.reset_counters();
  X x = nn::embedding<vocab>(emb, x_ids);
  for (int b = 0; b < 3; ++b) x = recompute ? mt::recompute(block, x) : block(x);
  const auto loss = mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(nn::dense<d_model, vocab>(x, w_logits), y));
  auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  r.counters = g.counters();
  if (g.is_planned()) r.report = mt::plan_report_of(g);
  r.loss = mt::item(loss);
  std::apply([&](auto&... gr) { (r.grads.push_back(mt::gather_all(gr)), ...); }, grads);
  // What one block's forward pass sends, untaped: recompute sends it once more per block.
  g.reset_counters();
  (void)block(x.detached());
  r.block_counters = g.counters();
  return r;
}
}  // namespace

TEST_CASE("recompute: the same loss and gradients, one more forward pass of each block, fewer activations kept",
          "[planned][recompute]") {
  const auto g = world_grid();
  for_each_type(list<mt::layout<grid, mt::split<batch, r_, c_>>,
                     mt::layout<grid, mt::split<vocab, r_, c_>, mt::split<heads, r_, c_>, mt::split<d_ff, r_, c_>>,
                     mt::layout<grid, mt::split<batch, r_>, mt::split<vocab, c_>, mt::split<heads, c_>, mt::split<d_ff, c_>>>{},
                [&]<class L>() {
                  INFO(layout_name<L>() << ", rank " << g.rank());
                  const stack_run plain = block_stack_step<L>(g, false), again = block_stack_step<L>(g, true);
                  CHECK(again.loss == plain.loss);
                  REQUIRE(again.grads.size() == plain.grads.size());
                  for (std::size_t i = 0; i < plain.grads.size(); ++i) {
                    INFO("gradient of parameter " << i);
                    require_close(again.grads[i], plain.grads[i], 1e-6);
                  }
                  // Counted: the plain step's collectives, and each of the 3 blocks' forward ones again.
                  mt::comm_counters want = plain.counters;
                  for (const auto& [key, n] : plain.block_counters) {
                    want[key].calls += 3 * n.calls;
                    want[key].bytes += 3 * n.bytes;
                  }
                  INFO("recomputed:\n" << describe(again.counters, g) << "plain:\n" << describe(plain.counters, g));
                  CHECK(again.counters == want);
                  if (!plain.block_counters.empty()) CHECK(again.counters != plain.counters);

                  // Planned for this rank: the same counts, and fewer activations alive at the peak.
                  const std::array<int, 2> coords{g.coord<r_>(), g.coord<c_>()};
                  const auto planned_plain = [&] { return block_stack_step<L>(grid::planned(g.sizes(), coords), false); }();
                  const auto planned_again = [&] { return block_stack_step<L>(grid::planned(g.sizes(), coords), true); }();
                  CHECK(planned_again.counters == again.counters);
                  REQUIRE(planned_plain.report);
                  REQUIRE(planned_again.report);
                  const auto acts = [](const stack_run& s) { return s.report->peak_bytes_of(mt::memory_kind::activations); };
                  INFO("activations at the peak: " << acts(planned_plain) << " bytes plain, " << acts(planned_again)
                                                   << " recomputed");
                  // A processor that holds none of the batch (5 over 6) keeps no activations either way.
                  const bool holds_tokens =
                      mt::zeros<mt::tensor<float, L, batch, length, d_model>>(g, {B, T, D}).local_size() > 0;
                  if (holds_tokens) {
                    CHECK(acts(planned_again) < acts(planned_plain));
                    CHECK(planned_again.report->peak_bytes < planned_plain.report->peak_bytes);
                  } else {
                    CHECK(acts(planned_again) <= acts(planned_plain));
                    CHECK(planned_again.report->peak_bytes <= planned_plain.report->peak_bytes);
                  }
                  // The plan names the second forward pass's collectives "(recompute)".
                  const auto& cs = planned_again.report->collectives;
                  if (!plain.block_counters.empty())
                    CHECK(std::any_of(cs.begin(), cs.end(), [](const auto& c) { return c.op.find("(recompute)") != std::string::npos; }));
                });
}

namespace {
// A stack of `blocks` Transformer blocks sharing their weights (so that the weights' gradients do
// not grow with depth), planned on one processor: the step's planned peak less what the forward
// pass saved for the backward one (the backward pass's own term). The loss is held (as a caller
// that reads it afterwards holds it) or given to gradient() as an rvalue (its graph freed on the way).
std::pair<std::int64_t, std::int64_t> backward_term(int blocks, bool rvalue_loss) {
  using L = mt::layout<grid>;
  using X = mt::tensor<float, L, batch, length, d_model>;
  const grid g = grid::planned({1, 1}, {0, 0});
  block_weights<L> w(g);
  auto params = w.tie();
  auto& [emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits] = w;
  const auto [x_ids, y] = ids_and_labels<L>(g);
  mt::reset_plan(g);
  X x = nn::embedding<vocab>(emb, x_ids);
  for (int b = 0; b < blocks; ++b) {
    const X a = x + nn::causal_attention<length, memory_length, d_model, heads, d_kv>(nn::layer_norm<d_model>(x, scale, bias), wq, wk, wv, wo);
    x = a + nn::feed_forward<d_model, d_ff>(nn::layer_norm<d_model>(a, scale, bias), w_in, w_out);
  }
  auto loss = mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(nn::dense<d_model, vocab>(x, w_logits), y));
  x = X(g, {B, T, D});  // the caller's last block output goes: only the tape holds the stack
  if (rvalue_loss) (void)std::apply([&](auto&... p) { return mt::gradient(std::move(loss), p...); }, params);
  else (void)std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  const auto r = mt::plan_report_of(g);
  return {r.peak_bytes - r.saved_for_backward, r.saved_for_backward};
}
}  // namespace

// A block with effects beyond its result keeps them to its first run: recomputing() is false while
// it runs forward and outside any block, true while the backward pass runs it again, and false
// once that run is over.
TEST_CASE("recomputing(): the block's run again in the backward pass, and only it", "[recompute]") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<batch, r_, c_>>;
  using X = mt::tensor<float, L, batch, length, d_model>;
  const auto x = mt::random_normal<X>(g, {4, 3, 2}, 5);
  auto w = mt::random_normal<mt::tensor<float, L, d_model>>(g, {2}, 6);
  w.requires_grad();
  std::vector<bool> seen;
  const auto block = [&](const X& in) {
    seen.push_back(mt::recomputing());
    return X(in * w);
  };
  const auto y = mt::recompute(block, x);
  CHECK(!mt::recomputing());
  (void)mt::gradient(mt::reduce_sum<batch, length, d_model>(y * y), w);
  CHECK(!mt::recomputing());
  REQUIRE(seen == std::vector<bool>{false, true});
}

// with_loss(y, extra): y's value, and extra's gradient as if extra were added to the loss y flows
// into; inside a recomputed block too (made again with the block's other results), equal to the
// plain sum's gradients (a balance loss on a mixture of experts' output, examples/llama).
TEST_CASE("with_loss: an extra loss rides on a block's output, recomputed or not", "[recompute]") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<batch, r_, c_>>;
  using X = mt::tensor<double, L, batch, length, d_model>;
  using W = mt::tensor<double, L, d_model>;
  auto x = mt::random_normal<X>(g, {4, 3, 2}, 5);
  auto w = mt::random_normal<W>(g, {2}, 6), v = mt::random_normal<W>(g, {2}, 7);
  x.requires_grad();
  w.requires_grad();
  v.requires_grad();
  const auto extra_of = [&](const X& in) { return mt::reduce_sum<batch, length, d_model>(in * in * v); };
  const auto block = [&](const X& in) { return mt::with_loss(X(in * w), extra_of(in)); };
  const auto y_plain = X(x * w);
  const auto want = mt::gradient(mt::reduce_sum<batch, length, d_model>(y_plain * y_plain) + extra_of(x), x, w, v);
  for (const bool again : {false, true}) {
    INFO((again ? "recomputed" : "not recomputed"));
    const X y = again ? mt::recompute(block, x) : block(x);
    require_close(mt::gather_all(y), mt::gather_all(y_plain), 0);
    const auto got = mt::gradient(mt::reduce_sum<batch, length, d_model>(y * y), x, w, v);
    require_close(mt::gather_all(std::get<0>(got)), mt::gather_all(std::get<0>(want)), 1e-12);
    require_close(mt::gather_all(std::get<1>(got)), mt::gather_all(std::get<1>(want)), 1e-12);
    require_close(mt::gather_all(std::get<2>(got)), mt::gather_all(std::get<2>(want)), 1e-12);
  }
}

// Issue 60: each op's gradient is dropped once its rule has run (it was kept to the pass's end, one
// block input's gradient and more per block), so the backward pass's term of the peak is the same
// at 2 and 8 blocks; what grows with depth is what the forward pass saved. Given the loss as an
// rvalue, the pass also frees each op's saved tensors once its rule has run: the peak is then at
// most what was saved plus that same term.
TEST_CASE("the backward pass frees as it goes: its term of the planned peak does not grow with depth", "[planned]") {
  const std::int64_t activation = B * T * D * 4;  // one block input, float
  for (bool rvalue : {false, true}) {
    const auto [back2, saved2] = backward_term(2, rvalue);
    const auto [back8, saved8] = backward_term(8, rvalue);
    INFO((rvalue ? "rvalue" : "held") << " loss: beyond the saved activations " << back2 << " bytes at 2 blocks, "
                                      << back8 << " at 8; saved " << saved2 << " and " << saved8
                                      << "; a block's input is " << activation);
    CHECK(saved8 > saved2 + 6 * activation);  // the forward pass's term grows: the stack is real
    CHECK(back8 <= back2 + activation / 2);
  }
}

namespace {
// Attention's input projections (heads over both axes): x's gradient comes from three products
// that each contract the split heads; the tape adds the three partials and reduces them once.
template <class L>
std::pair<mt::comm_counters, std::vector<float>> projections_backward(const grid& g) {
  using W = mt::tensor<float, L, d_model, heads>;
  auto x = mt::random_normal<mt::tensor<float, L, batch, d_model>>(g, {B, D}, 1);
  auto wq = mt::random_normal<W>(g, {D, H}, 2), wk = mt::random_normal<W>(g, {D, H}, 3), wv = mt::random_normal<W>(g, {D, H}, 4);
  x.requires_grad(), wq.requires_grad(), wk.requires_grad(), wv.requires_grad();
  const auto loss = mt::reduce_sum<batch, heads>(mt::einsum<batch, heads>(x, wq) * mt::einsum<batch, heads>(x, wk) +
                                                 mt::einsum<batch, heads>(x, wv));
  g.reset_counters();
  const auto [dx, dwq, dwk, dwv] = mt::gradient(loss, x, wq, wk, wv);
  return {g.counters(), mt::gather_all(dx)};
}

// A data-parallel MLP step's weight gradients (dense with bias, layer norm, dense): five partial
// sums over the batch's axes, reduced in buckets.
template <class L>
std::pair<mt::comm_counters, std::vector<std::vector<float>>> mlp_backward(const grid& g) {
  auto w1 = mt::random_normal<mt::tensor<float, L, d_model, hidden>>(g, {D, HID}, 1);
  auto b1 = mt::random_normal<mt::tensor<float, L, hidden>>(g, {HID}, 2);
  auto s = mt::random_normal<mt::tensor<float, L, hidden>>(g, {HID}, 3, 1.0, 0.1);
  auto bb = mt::random_normal<mt::tensor<float, L, hidden>>(g, {HID}, 4);
  auto w2 = mt::random_normal<mt::tensor<float, L, hidden, classes>>(g, {HID, C}, 5);
  for (auto* p : {&b1, &s, &bb}) p->requires_grad();
  w1.requires_grad(), w2.requires_grad();
  const auto x = mt::random_normal<mt::tensor<float, L, batch, d_model>>(g, {B, D}, 6);
  const auto h = nn::layer_norm<hidden>(mt::relu(nn::dense<d_model, hidden>(x, w1, b1)), s, bb);
  const auto logits = nn::dense<hidden, classes>(h, w2);
  const auto loss = mt::reduce_sum<batch, classes>(logits * logits);
  g.reset_counters();
  const auto grads = mt::gradient(loss, w1, b1, s, bb, w2);
  const mt::comm_counters counted = g.counters();
  std::vector<std::vector<float>> values;
  std::apply([&](const auto&... gr) { (values.push_back(mt::gather_all(gr)), ...); }, grads);
  return {counted, values};
}
}  // namespace

TEST_CASE("gradients' allreduces: partials over the same axes summed first, weight gradients in buckets",
          "[planned][lazy_allreduce]") {
  const auto g = world_grid();
  constexpr unsigned both = grid::mask<r_, c_>();
  const std::array<int, 2> coords{g.coord<r_>(), g.coord<c_>()};
  {
    using L = mt::layout<grid, mt::split<heads, r_, c_>>;
    const auto [counted, dx] = projections_backward<L>(g);
    INFO(describe(counted, g));
    // One allreduce of x's gradient (B x D floats, replicated), not one per projection.
    REQUIRE(counted.count({mt::collective::allreduce, both}));
    CHECK(counted.at({mt::collective::allreduce, both}).calls == 1);
    CHECK(counted.at({mt::collective::allreduce, both}).bytes == B * D * 4);
    CHECK(projections_backward<L>(grid::planned(g.sizes(), coords)).first == counted);
    // The same gradient as with nothing split.
    require_close(dx, projections_backward<mt::layout<grid>>(g).second, 1e-5);
  }
  {
    using L = mt::layout<grid, mt::split<batch, r_, c_>>;
    const std::int64_t weights = (D * HID + 3 * HID + HID * C) * 4;
    const mt::gradient_reduction defaults = mt::gradient_reduction_settings();
    const auto [counted, grads] = mlp_backward<L>(g);
    INFO(describe(counted, g));
    REQUIRE(counted.size() == 1);
    CHECK(counted.at({mt::collective::allreduce, both}).calls == 1);
    CHECK(counted.at({mt::collective::allreduce, both}).bytes == weights);
    CHECK(mlp_backward<L>(grid::planned(g.sizes(), coords)).first == counted);
    const auto calls_with = [&](mt::gradient_reduction r) {
      mt::set_gradient_reduction(r);
      const auto [c, gs] = mlp_backward<L>(g);
      mt::set_gradient_reduction(defaults);
      for (std::size_t i = 0; i < gs.size(); ++i) require_close(gs[i], grads[i], 1e-6);  // the same sums
      CHECK(c.at({mt::collective::allreduce, both}).bytes == weights);
      return c.at({mt::collective::allreduce, both}).calls;
    };
    // Buckets of at most w1's bytes: w1 alone, then b1, s, bb (3 x HID floats) together, then w2.
    CHECK(calls_with({.bucket_bytes = D * HID * 4}) == 3);
    CHECK(calls_with({.bucket_bytes = 0}) == 5);  // each alone
    // w1 and w2 (at least HID x C floats) in place, alone; b1, s, bb in one bucket.
    CHECK(calls_with({.in_place_bytes = HID * C * 4}) == 3);
    // Nonblocking, overlapping the backward pass: the same calls and sums.
    CHECK(calls_with({.overlap = true}) == 1);
    CHECK(calls_with({.in_place_bytes = 0, .overlap = true}) == 5);
    CHECK_THROWS_WITH(mt::set_gradient_reduction({.bucket_bytes = -1}),
                      Catch::Matchers::ContainsSubstring("bucket_bytes -1 must not be negative"));
  }
}
