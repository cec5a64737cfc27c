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

template <class Opt, class Params>
std::int64_t state_bytes(Opt& opt, Params params) {
  std::int64_t n = 0;
  opt.for_each_state(params, [&](std::size_t, const char*, auto& t) {
    n += t.local_size() * static_cast<std::int64_t>(sizeof(typename std::decay_t<decltype(t)>::value_type));
  });
  return n;
}
template <class Params>
std::int64_t param_bytes(Params params) {
  std::int64_t n = 0;
  std::apply([&](auto&... p) { ((n += p.local_size() * static_cast<std::int64_t>(sizeof(float))), ...); }, params);
  return n;
}

// One step of a Transformer block language model; the same code for a real and a planned mesh.
template <class L>
measured transformer_step(const grid& g) {
  using X = mt::tensor<float, L, batch, length, d_model>;
  using W = mt::tensor<float, L, d_model, heads, d_kv>;
  using WO = mt::tensor<float, L, heads, d_kv, d_model>;
  using S = mt::tensor<float, L, d_model>;
  std::optional<mt::plan_kind_scope> as_params(std::in_place, mt::memory_kind::parameters);
  auto emb = mt::random_normal<mt::tensor<float, L, vocab, d_model>>(g, {V, D}, 1);
  auto wq = nn::normal_fan_in<W, d_model>(g, {D, H, KV}, 2), wk = nn::normal_fan_in<W, d_model>(g, {D, H, KV}, 3),
       wv = nn::normal_fan_in<W, d_model>(g, {D, H, KV}, 4);
  auto wo = nn::normal_fan_in<WO, heads, d_kv>(g, {H, KV, D}, 5);
  auto scale = mt::full<S>(g, {D}, 1.0f);
  auto bias = mt::zeros<S>(g, {D});
  auto w_in = nn::normal_fan_in<mt::tensor<float, L, d_model, d_ff>, d_model>(g, {D, F}, 6);
  auto w_out = nn::normal_fan_in<mt::tensor<float, L, d_ff, d_model>, d_ff>(g, {F, D}, 7);
  auto w_logits = nn::normal_fan_in<mt::tensor<float, L, d_model, vocab>, d_model>(g, {D, V}, 8);
  as_params.reset();
  auto params = std::tie(emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits);
  std::apply([](auto&... p) { (p.requires_grad(), ...); }, params);
  std::vector<float> ids(B * T), labels(B * T);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 7) % V), labels[i] = static_cast<float>((i * 3 + 1) % V);
  mt::optim::adam adam({.lr = 1e-3});
  mt::optim::adafactor adafactor({.lr = 1e-3});

  g.reset_counters();
  using I = mt::tensor<float, L, batch, length>;
  const auto x_ids = mt::from_host<I>(g, {B, T}, ids);
  const auto y = mt::from_host<I>(g, {B, T}, labels);
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
  measured m{g.counters(), param_bytes(params), state_bytes(adam, params) + state_bytes(adafactor, params), {}};
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
  measured m{g.counters(), param_bytes(params), state_bytes(adam, params), {}};
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
  CHECK_THROWS_WITH(grid::planned({16, 32}, {16, 0}), Catch::Matchers::ContainsSubstring("coordinate 16 is outside axis 'r' of size 16"));
  // Real work while a planned mesh exists would run no kernel: refused, naming the tensor.
  const auto g = world_grid();
  CHECK_THROWS_WITH((mt::zeros<mt::tensor<float, L, batch, hidden>>(g, {4, 4})),
                    Catch::Matchers::ContainsSubstring("tensor<batch, hidden>: made on a real mesh while a planned mesh exists"));
}
