// A planned run (mesh::planned, docs/scale.md) predicts what a real run does, exactly: on every
// rank, a training step (a Transformer block and an MLP, forward, backward, Adam and Adafactor) is
// run for real, then planned in the same process for this rank's coordinates of a mesh of the same
// sizes; the counted collectives (calls and bytes, per collective and axis set) and the bytes of
// the parameters and optimizer state must be equal, under 5 layouts of the Transformer and 6 of the MLP.
#include <catch2/matchers/catch_matchers_string.hpp>
#include <optional>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct memory_length : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct hidden : mt::dim<"hidden"> {};
struct classes : mt::dim<"classes"> {};

// Extents that divide by none of 3, 4 or 6 where it matters, so uneven parts are planned too.
constexpr std::int64_t B = 5, T = 6, D = 8, H = 5, KV = 3, F = 14, V = 11, HID = 10, C = 7;

struct measured {
  mt::comm_counters counters;
  std::int64_t param_bytes = 0, state_bytes = 0;
  std::optional<mt::plan_report> report;  // a planned run's, taken while its tensors are alive
};

// The weights of a Transformer block LM (one block; embedding and output weights), as params.
template <class L>
struct block_weights {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  t<vocab, d_model> emb;
  t<d_model, heads, d_kv> wq, wk, wv;
  t<heads, d_kv, d_model> wo;
  t<d_model> scale, bias;
  t<d_model, d_ff> w_in;
  t<d_ff, d_model> w_out;
  t<d_model, vocab> w_logits;

  explicit block_weights(const grid& g) {
    const mt::plan_kind_scope as_params(mt::memory_kind::parameters);
    emb = mt::random_normal<t<vocab, d_model>>(g, {V, D}, 1);
    wq = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {D, H, KV}, 2);
    wk = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {D, H, KV}, 3);
    wv = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {D, H, KV}, 4);
    wo = nn::normal_fan_in<t<heads, d_kv, d_model>, heads, d_kv>(g, {H, KV, D}, 5);
    scale = mt::random_normal<t<d_model>>(g, {D}, 9, 1.0, 0.1);
    bias = mt::random_normal<t<d_model>>(g, {D}, 10, 0.0, 0.1);
    w_in = nn::normal_fan_in<t<d_model, d_ff>, d_model>(g, {D, F}, 6);
    w_out = nn::normal_fan_in<t<d_ff, d_model>, d_ff>(g, {F, D}, 7);
    w_logits = nn::normal_fan_in<t<d_model, vocab>, d_model>(g, {D, V}, 8);
    std::apply([](auto&... p) { (p.requires_grad(), ...); }, tie());
  }
  auto tie() { return std::tie(emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits); }
};

// Token ids and next-token labels of a [B x T] batch.
template <class L>
auto ids_and_labels(const grid& g) {
  std::vector<float> ids(B * T), labels(B * T);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 7) % V), labels[i] = static_cast<float>((i * 3 + 1) % V);
  using I = mt::tensor<float, L, batch, length>;
  return std::pair{mt::from_host<I>(g, {B, T}, ids), mt::from_host<I>(g, {B, T}, labels)};
}

// One step of a Transformer block language model; the same code for a real and a planned mesh.
template <class L>
measured transformer_step(const grid& g) {
  using X = mt::tensor<float, L, batch, length, d_model>;
  block_weights<L> w(g);
  auto params = w.tie();
  auto& [emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits] = w;
  mt::optim::adam adam({.lr = 1e-3});
  mt::optim::adafactor adafactor({.lr = 1e-3});

  g.reset_counters();
  const auto [x_ids, y] = ids_and_labels<L>(g);
  X x = nn::embedding<vocab>(emb, x_ids);
  const auto h = nn::layer_norm<d_model>(x, scale, bias);
  x = x + nn::causal_attention<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo);
  x = x + nn::feed_forward<d_model, d_ff>(nn::layer_norm<d_model>(x, scale, bias), w_in, w_out);
  const auto logits = nn::dense<d_model, vocab>(x, w_logits);
  const auto loss = mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(logits, y));
  auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  adam.step(params, grads);
  adafactor.step(params, grads);
  (void)mt::item(loss);
  measured m{g.counters(), mt::local_bytes(params), adam.state_bytes(params) + adafactor.state_bytes(params), {}};
  if (g.is_planned()) m.report = mt::plan_report_of(g);
  return m;
}

// One step of a two-layer MLP classifier with SGD-free Adam.
template <class L>
measured mlp_step(const grid& g) {
  std::optional<mt::plan_kind_scope> as_params(std::in_place, mt::memory_kind::parameters);
  auto w1 = nn::normal_fan_in<mt::tensor<float, L, d_model, hidden>, d_model>(g, {D, HID}, 1);
  auto b1 = mt::zeros<mt::tensor<float, L, hidden>>(g, {HID});
  auto w2 = nn::normal_fan_in<mt::tensor<float, L, hidden, classes>, hidden>(g, {HID, C}, 2);
  as_params.reset();
  auto params = std::tie(w1, b1, w2);
  std::apply([](auto&... p) { (p.requires_grad(), ...); }, params);
  mt::optim::adam adam({.lr = 1e-3});
  g.reset_counters();
  const auto x = mt::random_normal<mt::tensor<float, L, batch, d_model>>(g, {B, D}, 3);
  std::vector<float> labels(B);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<float>(i % C);
  const auto y = mt::from_host<mt::tensor<float, L, batch>>(g, {B}, labels);
  const auto hdn = mt::relu(nn::dense<d_model, hidden>(x, w1, b1));
  const auto loss = mt::reduce_mean<batch>(nn::softmax_cross_entropy<classes>(nn::dense<hidden, classes>(hdn, w2), y));
  auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  adam.step(params, grads);
  (void)mt::item(loss);
  measured m{g.counters(), mt::local_bytes(params), adam.state_bytes(params), {}};
  if (g.is_planned()) m.report = mt::plan_report_of(g);
  return m;
}

std::string describe(const mt::comm_counters& c, const grid& g) {
  std::ostringstream s;
  for (const auto& [key, n] : c)
    s << mt::to_string(key.first) << " over {" << g.axes_string(key.second) << "}: " << n.calls << " calls, "
      << n.bytes << " bytes\n";
  return s.str();
}

template <class Step>
void check_planned_equals_real(const grid& g, Step step) {
  const measured real = step(g);
  const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
  const measured planned = step(pm);
  REQUIRE(planned.report);
  const auto& report = *planned.report;
  INFO("rank " << g.rank() << "\nreal:\n" << describe(real.counters, g) << "planned:\n" << describe(planned.counters, g));
  CHECK(planned.counters == real.counters);
  CHECK(report.totals == real.counters);
  CHECK(planned.param_bytes == real.param_bytes);
  CHECK(report.bytes_of(mt::memory_kind::parameters) == real.param_bytes);
  CHECK(report.bytes_of(mt::memory_kind::optimizer_state) == real.state_bytes);
  // The gradients gradient() handed out (the tape's own, allocated in the backward pass) count as
  // gradients: one per param, alive when the report is taken.
  CHECK(report.bytes_of(mt::memory_kind::gradients) == real.param_bytes);
  CHECK(report.peak_bytes >= real.param_bytes + real.state_bytes);
}
}  // namespace

using transformer_layouts =
    list<mt::layout<grid>, mt::layout<grid, mt::split<batch, r_, c_>>,
         mt::layout<grid, mt::split<vocab, r_, c_>, mt::split<heads, r_, c_>, mt::split<d_ff, r_, c_>>,
         mt::layout<grid, mt::split<batch, r_>, mt::split<vocab, c_>, mt::split<heads, c_>, mt::split<d_ff, c_>>,
         mt::layout<grid, mt::split<batch, c_>, mt::split<d_model, r_>>>;

TEST_CASE("a planned Transformer step counts what the real one sends", "[planned]") {
  const auto g = world_grid();
  for_each_type(transformer_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    check_planned_equals_real(g, [](const grid& m) { return transformer_step<L>(m); });
  });
}

// Six of the 19 layouts of the 2-D mesh over (batch, hidden): each kind of split once (none, one
// axis, both axes in either order, both dims), not all 19, for compile time; the examples' three
// layouts each are checked by their --check-plan tests.
using mlp_layouts = list<mt::layout<grid>, mt::layout<grid, mt::split<batch, r_>>, mt::layout<grid, mt::split<hidden, c_>>,
                         mt::layout<grid, mt::split<batch, r_, c_>>, mt::layout<grid, mt::split<hidden, c_, r_>>,
                         mt::layout<grid, mt::split<batch, c_>, mt::split<hidden, r_>>>;

TEST_CASE("a planned MLP step counts what the real one sends", "[planned]") {
  const auto g = world_grid();
  for_each_type(mlp_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    check_planned_equals_real(g, [](const grid& m) { return mlp_step<L>(m); });
  });
}

TEST_CASE("a planned mesh of 512 processors plans without MPI", "[planned]") {
  using L = mt::layout<grid, mt::split<batch, r_>, mt::split<hidden, c_>>;
  const auto pm = grid::planned({16, 32}, {3, 31});
  REQUIRE(pm.is_planned());
  REQUIRE(pm.nprocs() == 512);
  REQUIRE(pm.rank() == 3 * 32 + 31);
  const auto x = mt::random_normal<mt::tensor<float, L, batch, hidden>>(pm, {160, 100}, 1);
  // 100 over 32: the first 4 parts hold 4, the others 3; coordinate 31 holds 3.
  CHECK(x.local_extent<hidden>() == 3);
  CHECK(x.local_extent<batch>() == 10);
  mt::reset_plan(pm);
  const auto s = mt::reduce_sum<hidden>(x);  // [batch]: an allreduce of 10 floats over c
  const auto r = mt::plan_report_of(pm);
  REQUIRE(r.collectives.size() == 1);
  CHECK(r.collectives[0].op == "reduce_sum");
  CHECK(r.collectives[0].collective == "allreduce");
  CHECK(r.collectives[0].axes == "c");
  CHECK(r.collectives[0].bytes == 10 * 4);
  CHECK(r.peak_bytes == (10 * 3 + 10) * 4);
  CHECK(r.json().find("\"op\": \"reduce_sum\"") != std::string::npos);
  mt::reset_plan(pm);
  (void)mt::einsum<batch>(x, x);  // 10 local rows, 3 products each: 2 * 10 * 3 FLOPs, then an allreduce
  const auto e = mt::plan_report_of(pm);
  CHECK(e.total_flops == 2 * 10 * 3);
  REQUIRE(e.flops.size() == 1);
  CHECK(e.flops[0].op == "einsum");
  // scatter planned for a processor other than the root: it passes an empty span, as a real one does.
  using T = mt::tensor<float, L, batch, hidden>;
  CHECK_NOTHROW(mt::scatter<T>(pm, {160, 100}, std::span<const float>{}));
  const std::vector<float> too_short(7);
  CHECK_THROWS_WITH(mt::scatter<T>(pm, {160, 100}, too_short),
                    Catch::Matchers::ContainsSubstring("scatter: the host array has 7 elements, but tensor<batch, hidden>[batch=160, hidden=100] has 16000"));
  CHECK_THROWS_WITH(grid::planned({16, 32}, {16, 0}), Catch::Matchers::ContainsSubstring("coordinate 16 is outside axis 'r' of size 16"));
  // Real work while a planned mesh exists would run no kernel: refused, naming the tensor.
  const auto g = world_grid();
  CHECK_THROWS_WITH((mt::zeros<mt::tensor<float, L, batch, hidden>>(g, {4, 4})),
                    Catch::Matchers::ContainsSubstring("tensor<batch, hidden>: made on a real mesh while a planned mesh exists"));
}

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
                  CHECK(acts(planned_again) < acts(planned_plain));
                  CHECK(planned_again.report->peak_bytes < planned_plain.report->peak_bytes);
                  // The plan names the second forward pass's collectives "(recompute)".
                  const auto& cs = planned_again.report->collectives;
                  if (!plain.block_counters.empty())
                    CHECK(std::any_of(cs.begin(), cs.end(), [](const auto& c) { return c.op.find("(recompute)") != std::string::npos; }));
                });
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
